"""Shape inference for every op the engine runs, backend-agnostic.

`infer(node, inputs)` returns each output's (shape, dtype) from the input shapes and the
host values of shape-like inputs (Reshape targets, slice bounds, axes), which the Pipeline
folds on the host first.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend import Node, Tensor
from mnngpu.errors import ModelFormatError
from mnngpu.runtime import host_ops
from mnngpu.runtime.host_ops import FLOAT, INT

Shape = tuple[int, ...]


def _host_values(node: Node, inputs: list[Tensor], first: int) -> list[np.ndarray]:
    values = []
    for i, tensor in enumerate(inputs[first:], start=first):
        if tensor.host is None:
            raise ModelFormatError(f"input {i} ('{tensor.name}') must be known before the op runs "
                                   "(a shape or index input computed from activations)", field=node.name)
        values.append(tensor.host)
    return values


def _attention(node: Node, inputs: list[Tensor]) -> Shape:
    q = inputs[0].shape  # (1, seq, heads, head_dim)
    if len(q) != 4:
        raise ModelFormatError(f"Attention query must be 4-D (1, seq, heads, head_dim), got {q}", field=node.name)
    if getattr(node.param, "output_c4", False):
        return (q[0] * q[1], q[2] * q[3], 1, 1)
    return (q[0], q[1], q[2] * q[3])


def _convolution(node: Node, inputs: list[Tensor]) -> Shape:
    x = inputs[0].shape
    common = node.param.common
    if len(x) < 2 or x[1] != common.inputCount:
        raise ModelFormatError(f"Convolution expects {common.inputCount} input channels, got shape {x}",
                               field=node.name)
    return (x[0], common.outputCount, *x[2:])


def _gather(node: Node, inputs: list[Tensor]) -> Shape:
    params, indices = inputs[0].shape, inputs[1].shape
    axis = int(np.asarray(_host_values(node, inputs, 2)[0]).reshape(-1)[0]) if len(inputs) > 2 else 0
    axis %= len(params)
    return params[:axis] + indices + params[axis + 1:]


def _concat(node: Node, inputs: list[Tensor]) -> Shape:
    axis = int(node.param.axis) % len(inputs[0].shape)
    shape = list(inputs[0].shape)
    shape[axis] = sum(t.shape[axis] for t in inputs)
    return tuple(shape)


def infer(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    op = node.type
    x = inputs[0] if inputs else None
    if op in ("Shape", "Rank", "Size"):
        return [((len(x.shape),) if op == "Shape" else (), INT)]
    if op in ("ConvertTensor", "Identity", "LayerNorm", "UnaryOp"):
        return [(x.shape, x.dtype)]
    if op == "Cast":
        return [(x.shape, host_ops.DTYPES.get(node.param.dstT, FLOAT))]
    if op == "BinaryOp":
        return [(tuple(np.broadcast_shapes(x.shape, inputs[1].shape)), x.dtype)]
    if op == "Reshape":
        dims = host_ops.reshape_dims(node, [x, *_host_values(node, inputs, 1)])
        return [(host_ops.reshape_shape(x.shape, dims), x.dtype)]
    if op in ("Squeeze", "Unsqueeze", "StridedSlice"):
        evaluator = {"Squeeze": host_ops.squeeze, "Unsqueeze": host_ops.unsqueeze,
                     "StridedSlice": host_ops.strided_slice}[op]
        return [(evaluator(node, [host_ops.shape_stand_in(x), *_host_values(node, inputs, 1)]).shape, x.dtype)]
    if op in ("GatherV2", "Gather"):
        return [(_gather(node, inputs), x.dtype)]
    if op == "Concat":
        return [(_concat(node, inputs), x.dtype)]
    if op == "Convolution":
        return [(_convolution(node, inputs), FLOAT)]
    if op == "Attention":
        return [(_attention(node, inputs), FLOAT)]
    from mnngpu.runtime.fusion import SHAPE_RULES  # fused node types; imported here: fusion imports us
    if op in SHAPE_RULES:
        return SHAPE_RULES[op](node, inputs)
    raise ModelFormatError(f"op type {op} is not supported by mnngpu", field=node.name)
