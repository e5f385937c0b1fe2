"""Host-side planning of data movement: which input element each output element reads.

Ops that only move elements (slices, gathers, concatenation, broadcasting) are planned by
running mnngpu's own host semantics on an index stand-in, an array holding each element's
flat index. The result is then described as strides when it is affine, which it is for every
slice, concatenation and broadcast; the kernels walk those strides.
"""

from __future__ import annotations

import numpy as np
from pyopencl import cltypes

MAX_RANK = 8  # the kernels take shapes and strides as int8 vectors


def affine_strides(offsets: np.ndarray) -> tuple[int, list[int]] | None:
    """(base, strides) such that offsets[idx] == base + sum(idx * strides), or None."""
    if offsets.size == 0:
        return 0, [0] * offsets.ndim
    base = int(offsets.flat[0])
    strides = []
    for axis, extent in enumerate(offsets.shape):
        step = [0] * offsets.ndim
        step[axis] = 1 if extent > 1 else 0
        strides.append(int(offsets[tuple(step)]) - base if extent > 1 else 0)
    rebuilt = np.full(offsets.shape, base, dtype=np.int64)
    for axis, (extent, stride) in enumerate(zip(offsets.shape, strides)):
        view = [1] * offsets.ndim
        view[axis] = extent
        rebuilt = rebuilt + (np.arange(extent, dtype=np.int64) * stride).reshape(view)
    return (base, strides) if np.array_equal(rebuilt, offsets) else None


def compact(shape: tuple[int, ...], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours that every stride list walks contiguously,
    so fewer dims (less index arithmetic) describe the same walk."""
    dims = [(n, [s[axis] for s in strides]) for axis, n in enumerate(shape) if n != 1]
    merged: list[tuple[int, list[int]]] = []
    for extent, steps in dims:
        if merged:
            outer_extent, outer_steps = merged[-1]
            if all(o == i * extent for o, i in zip(outer_steps, steps)):
                merged[-1] = (outer_extent * extent, steps)
                continue
        merged.append((extent, steps))
    if not merged:
        merged = [(1, [0] * len(strides))]
    return [n for n, _ in merged], [[steps[k] for _, steps in merged] for k in range(len(strides))]


def int8_vector(values: list[int], fill: int) -> np.ndarray:
    """An OpenCL int8 argument: `values` right-aligned, outer dims padded with `fill`."""
    padded = [fill] * (MAX_RANK - len(values)) + list(values)
    return cltypes.make_int8(*padded)
