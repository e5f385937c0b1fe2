"""Ops about shapes: Shape, Rank and Size read only their input's shape (always folded on the
host), and Fill makes a tensor of a shape given as a value (every element one scalar)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.ops.common import INT, OpType, Shape, host_values

if TYPE_CHECKING:
    from mnngpu.backend import Node, Tensor


def shape_of(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """Shape, Rank, Size: a small int tensor about the input's shape."""
    return [((len(inputs[0].shape),) if node.type == "Shape" else (), INT)]


def shape(node, inputs):
    return np.array(inputs[0].shape, dtype=INT)


def rank(node, inputs):
    return np.array(inputs[0].ndim, dtype=INT)


def size(node, inputs):
    return np.array(inputs[0].size, dtype=INT)


def _fill_dims(node, dims, value_count: int) -> Shape:
    """The output dims of a Fill: input 0 a 1-D list of non-negative dims, input 1 a single value."""
    dims = np.asarray(dims)
    if dims.ndim != 1 or value_count != 1 or (dims < 0).any():
        raise ModelFormatError(f"a Fill of a 1-D shape of non-negative dims and a single value, got dims "
                               f"{dims.tolist()} and {value_count} values", field=node.name)
    return tuple(int(d) for d in dims)


def fill_shape(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """Fill: the dims input 0 holds (known on the host), the dtype of the value."""
    (dims,) = host_values(node, inputs[:1], 0)
    return [(_fill_dims(node, dims, inputs[1].size), inputs[1].dtype)]


def fill(node, inputs):
    dims, value = inputs[0], np.asarray(inputs[1])
    return np.full(_fill_dims(node, dims, value.size), value.reshape(()), dtype=value.dtype)


ROWS = {
    "Shape": OpType(shape_of, shape, shape_only=True),
    "Rank": OpType(shape_of, rank, shape_only=True),
    "Size": OpType(shape_of, size, shape_only=True),
    "Fill": OpType(fill_shape, fill, param="Fill", min_inputs=2),
}
