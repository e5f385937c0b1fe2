"""Shapes and strides as the OpenCL kernels take them: int8 vectors, padded (at most MAX_RANK
dims). The strides themselves are planned in mnngpu.runtime.movement, shared by every backend."""

from __future__ import annotations

import numpy as np
from pyopencl import cltypes

MAX_RANK = 8  # the kernels take shapes and strides as int8 vectors


def int8_vector(values: list[int], fill: int) -> np.ndarray:
    """An OpenCL int8 argument: `values` right-aligned, outer dims padded with `fill`."""
    padded = [fill] * (MAX_RANK - len(values)) + list(values)
    return cltypes.make_int8(*padded)
