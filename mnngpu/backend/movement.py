"""Planning data movement for device backends, from the host semantics written once.

Ops that only move elements (StridedSlice, GatherV2, Concat) are planned by running their host
rules (mnngpu/ops/movement.py) on an index stand-in, an array holding each element's own flat
index: the result tells which input element every output element is. A backend then turns
these index maps into strided or mapped copy kernels, with the stride helpers here (the
broadcast of a binary op's inputs, merging dims, fitting an index map with strides).
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend import Node, Tensor
from mnngpu.ops import op_table
from mnngpu.ops.movement import concat


def index_stand_in(shape: tuple[int, ...]) -> np.ndarray:
    """An int64 array of `shape` whose every element is its own flat index."""
    return np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)


def contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    """Element strides of a C-ordered array of `shape`."""
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= int(extent)
    return strides[::-1]


def broadcast_strides(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[int]:
    """Element strides of a `shape` input read across `out_shape` (numpy broadcasting): 0 along
    the dims it is broadcast over."""
    padded = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    return [0 if size == 1 and out != 1 else stride
            for size, out, stride in zip(padded, out_shape, contiguous_strides(padded))]


def coalesce(shape, *strides) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours that every stride list walks as one dim, so fewer
    dims (less index arithmetic in a kernel) describe the same walk."""
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


def affine_strides(offsets: np.ndarray) -> tuple[int, list[int]] | None:
    """(base, strides) such that offsets[idx] == base + sum(idx * strides), or None when the index
    map is not affine (a gather of arbitrary rows)."""
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


def gather_sources(node: Node, inputs: list[Tensor]) -> np.ndarray:
    """For a slice or gather whose other inputs are host-known: the flat input index each
    output element reads, shaped like the output."""
    stand_in = index_stand_in(inputs[0].shape)
    return np.asarray(op_table.evaluate(node, [stand_in, *(t.host for t in inputs[1:])])[0])


def concat_destinations(node: Node, inputs: list[Tensor]) -> list[np.ndarray]:
    """For each Concat input: the flat output index of each of its elements, shaped like it."""
    absent = [np.full(t.shape, -1, dtype=np.int64) for t in inputs]
    destinations = []
    for j, part in enumerate(inputs):
        stand_ins = absent[:j] + [index_stand_in(part.shape)] + absent[j + 1:]
        layout = np.asarray(concat(node, stand_ins)).reshape(-1)
        positions = np.flatnonzero(layout >= 0)
        destination = np.empty(part.size, dtype=np.int64)
        destination[layout[positions]] = positions
        destinations.append(destination.reshape(part.shape))
    return destinations
