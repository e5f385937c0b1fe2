"""Host-side planning of strided element loops: the shapes and strides the copy and binary
kernels take (at most MAX_RANK dims after merging), and splitting an index map into such loops."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.runtime.movement import affine_strides, coalesce, contiguous_strides

MAX_RANK = 6


def padded(values: list[int], what: str) -> list[int]:
    """`values` filled up to MAX_RANK entries for a push-constant array."""
    if len(values) > MAX_RANK:
        raise ModelFormatError(f"{what}: at most {MAX_RANK} dims after merging, got {len(values)}")
    return list(values) + [0] * (MAX_RANK - len(values))


@dataclass
class StridedCopy:
    """dst[dst_offset + sum(c * dst_strides)] = src[src_offset + sum(c * src_strides)] over `shape`."""

    shape: list[int]
    src_offset: int
    src_strides: list[int]
    dst_offset: int
    dst_strides: list[int]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def affine_copies(index: np.ndarray) -> list[StridedCopy]:
    """Strided copies that fill a contiguous output whose element e is source element index[e].

    A slice's index map is affine in the output coordinates (one copy); a gather's splits
    along its leading axes into affine pieces."""
    copies: list[StridedCopy] = []
    _split(np.asarray(index, dtype=np.int64), 0, copies)
    return copies


def _split(index: np.ndarray, dst_offset: int, copies: list[StridedCopy]) -> None:
    if index.size == 0:
        return
    fitted = affine_strides(index)
    if fitted is not None:
        src_offset, src_strides = fitted
        shape, (src, dst) = coalesce(index.shape, src_strides, contiguous_strides(index.shape))
        copies.append(StridedCopy(shape, src_offset, src, dst_offset, dst))
        return
    while index.shape[0] == 1:
        index = index[0]
    step = int(np.prod(index.shape[1:], dtype=np.int64))
    for i in range(index.shape[0]):
        _split(index[i], dst_offset + i * step, copies)
