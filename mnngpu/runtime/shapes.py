"""Shape rules, backend-agnostic: each gives an op's outputs' (shape, dtype) from its input
shapes and the host values of shape-like inputs (Reshape targets, slice bounds, axes), which
placement folds on the host first. runtime/op_table.py says which rule each op type takes.
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
    if len(x) not in (3, 4):
        if (common.kernelX, common.kernelY) != (1, 1):
            raise ModelFormatError(f"a {common.kernelY}x{common.kernelX} Convolution needs an [n, c, h, w] "
                                   f"or [n, c, h] input, got {x}", field=node.name)
        return (x[0], common.outputCount, *x[2:])
    if common.group != 1 or common.padMode != "CAFFE":
        raise ModelFormatError(f"a Convolution with group 1 and explicit pads (CAFFE), got group {common.group}, "
                               f"padMode {common.padMode}: grouped and SAME/VALID convolutions are not implemented",
                               field=node.name)
    out = (x[0], common.outputCount, *host_ops.conv_output_size(common, *x[2:], *((1,) if len(x) == 3 else ())))
    return out[:len(x)]   # as MNN, a 3-D [n, c, h] input is [n, c, h, 1] and its output keeps three axes


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


def shape_of(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """Shape, Rank, Size: a small int tensor about the input's shape."""
    return [((len(inputs[0].shape),) if node.type == "Shape" else (), INT)]


def same(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """The input's shape and dtype (ConvertTensor, Identity, LayerNorm, UnaryOp)."""
    return [(inputs[0].shape, inputs[0].dtype)]


def cast(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    return [(inputs[0].shape, host_ops.DTYPES.get(node.param.dstT, FLOAT))]


def binary(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    return [(tuple(np.broadcast_shapes(inputs[0].shape, inputs[1].shape)), inputs[0].dtype)]


def reshape(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    x = inputs[0]
    dims = host_ops.reshape_dims(node, [x, *_host_values(node, inputs, 1)])
    return [(host_ops.reshape_shape(x.shape, dims), x.dtype)]


def by_evaluation(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """Squeeze, Unsqueeze, StridedSlice and the movement ops: their host semantics run on a
    zero-cost stand-in (one result per output; Unpack has several)."""
    evaluator = {"Squeeze": host_ops.squeeze, "Unsqueeze": host_ops.unsqueeze,
                 "StridedSlice": host_ops.strided_slice, "SliceTf": host_ops.slice_tf,
                 "Transpose": host_ops.transpose, "Permute": host_ops.permute, "Unpack": host_ops.unpack,
                 "Im2Col": host_ops.im2col, "TopKV2": host_ops.top_k, "Pooling": host_ops.pooling}[node.type]
    x = inputs[0]
    result = evaluator(node, [host_ops.shape_stand_in(x), *_host_values(node, inputs, 1)])
    return [(part.shape, part.dtype if node.type == "TopKV2" else x.dtype)
            for part in (result if isinstance(result, tuple) else (result,))]


def matmul(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    a, b = (list(t.shape) for t in inputs[:2])
    if node.param is not None and node.param.transposeA:
        a[-2:] = a[-1], a[-2]
    if node.param is not None and node.param.transposeB:
        b[-2:] = b[-1], b[-2]
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        raise ModelFormatError(f"MatMul of {inputs[0].shape} and {inputs[1].shape}: inner sizes differ",
                               field=node.name)
    return [((*np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])), a[-2], b[-1]), inputs[0].dtype)]


def eltwise(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    return [(np.broadcast_shapes(*(t.shape for t in inputs)), inputs[0].dtype)]


def gather(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    return [(_gather(node, inputs), inputs[0].dtype)]


def concat(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    return [(_concat(node, inputs), inputs[0].dtype)]


def convolution(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    return [(_convolution(node, inputs), FLOAT)]


def attention(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    return [(_attention(node, inputs), FLOAT)]


def linear_group(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """A fused node of Convolutions on one input: one output per member."""
    return [convolution(member, inputs[:1])[0] for member in node.param.members]


def gated_linear(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """up * silu(gate): the members' common output."""
    return linear_group(node, inputs)[:1]


def top_k(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """TopKV2: values and int32 indices, the axis cut to k."""
    x = inputs[0]
    k, axis = host_ops.top_k_axis([None, *_host_values(node, inputs, 1)], len(x.shape))
    if not 0 < k <= x.shape[axis]:
        raise ModelFormatError(f"TopKV2 k must be in [1, {x.shape[axis]}], got {k}", field=node.name)
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [(shape, x.dtype), (shape, INT)]


def reduction(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    x = inputs[0]
    axes = host_ops.reduction_axes(node, [None, *_host_values(node, inputs, 1)], len(x.shape))
    keep = bool(node.param.keepDims)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
    return [(shape, x.dtype)]


def expert_add(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """EXPERT_ADD (runtime/moe.py): the expert output's (rows, H), once the routing holds top_k
    weights and ids for each of those rows."""
    y, weights, selected = inputs[:3]
    want = (y.shape[0] if len(y.shape) == 2 else -1) * node.param.top_k
    if weights.size != want or selected.size != want or (len(inputs) > 3 and inputs[3].shape != y.shape):
        raise ModelFormatError(f"a MoE expert output of shape (rows, hidden) and top_k={node.param.top_k} routing "
                               f"entries per row, got output {y.shape}, weights {weights.shape} and expert ids "
                               f"{selected.shape}", field=node.name)
    return [(y.shape, y.dtype)]
