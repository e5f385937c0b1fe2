"""Host-side planning of strided element loops: the shapes and strides the copy and binary
kernels take (at most MAX_RANK dims after merging), and splitting an index map into such loops."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.runtime.movement import contiguous_strides

MAX_RANK = 6


def broadcast_strides(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[int]:
    """Element strides of a `shape` input read across `out_shape` (numpy broadcasting): 0 along
    the dims it is broadcast over."""
    padded = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    return [0 if size == 1 and out != 1 else stride
            for size, out, stride in zip(padded, out_shape, contiguous_strides(padded))]


def coalesce(shape, *strides) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours that every stride list walks as one dim."""
    dims = [(int(n), [int(s[i]) for s in strides]) for i, n in enumerate(shape) if int(n) != 1]
    merged: list[tuple[int, list[int]]] = []
    for size, step in dims:
        if merged and all(prev == cur * size for prev, cur in zip(merged[-1][1], step)):
            merged[-1] = (merged[-1][0] * size, step)
        else:
            merged.append((size, step))
    if not merged:
        merged = [(1, [0] * len(strides))]
    return [n for n, _ in merged], [[s[i] for _, s in merged] for i in range(len(strides))]


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
    fitted = _affine(index)
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


def _affine(index: np.ndarray) -> tuple[int, list[int]] | None:
    """(offset, strides) with index == offset + sum(coord * strides), or None."""
    origin = (0,) * index.ndim
    offset = int(index[origin]) if index.ndim else int(index)
    strides = []
    for axis, size in enumerate(index.shape):
        if size == 1:
            strides.append(0)
            continue
        unit = list(origin)
        unit[axis] = 1
        strides.append(int(index[tuple(unit)]) - offset)
    predicted = offset + sum(np.arange(size).reshape([-1 if a == axis else 1 for a in range(index.ndim)]) * stride
                             for axis, (size, stride) in enumerate(zip(index.shape, strides)))
    return (offset, strides) if np.array_equal(index, np.broadcast_to(predicted, index.shape)) else None
