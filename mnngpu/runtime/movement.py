"""Planning data movement for device backends, from the host semantics written once.

Ops that only move elements (StridedSlice, GatherV2, Concat) are planned by running
mnngpu.runtime.host_ops on an index stand-in, an array holding each element's own flat
index: the result tells which input element every output element is. A backend then turns
these index maps into strided or mapped copy kernels.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend import Node, Tensor
from mnngpu.runtime import host_ops


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


def gather_sources(node: Node, inputs: list[Tensor]) -> np.ndarray:
    """For a slice or gather whose other inputs are host-known: the flat input index each
    output element reads, shaped like the output."""
    stand_in = index_stand_in(inputs[0].shape)
    return np.asarray(host_ops.evaluate(node, [stand_in, *(t.host for t in inputs[1:])])[0])


def concat_destinations(node: Node, inputs: list[Tensor]) -> list[np.ndarray]:
    """For each Concat input: the flat output index of each of its elements, shaped like it."""
    absent = [np.full(t.shape, -1, dtype=np.int64) for t in inputs]
    destinations = []
    for j, part in enumerate(inputs):
        stand_ins = absent[:j] + [index_stand_in(part.shape)] + absent[j + 1:]
        layout = np.asarray(host_ops.concat(node, stand_ins)).reshape(-1)
        positions = np.flatnonzero(layout >= 0)
        destination = np.empty(part.size, dtype=np.int64)
        destination[layout[positions]] = positions
        destinations.append(destination.reshape(part.shape))
    return destinations
