"""Data movement: views (Reshape, ConvertTensor, Identity, Squeeze, Unsqueeze), slices and
gathers (StridedSlice, SliceTf, Gather, GatherV2), Slice (a split into several outputs), Concat,
the vision encoders' Transpose, Permute and Unpack, and BroadcastTo (ONNX Expand). Their numpy
semantics are the single source: device backends plan their copy kernels from them
(mnngpu/backend/movement.py). Layouts are logical NCHW: an NC4HW4 tensor holds the same values,
so ConvertTensor is the identity here.
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.ops.common import ALWAYS, WITHOUT_SECOND_INPUT, OpType, Shape, evaluated, host_values, same

if TYPE_CHECKING:
    from mnngpu.backend import Node, Tensor

# The ops that only relabel a buffer: a backend's Execution for them makes the output share the
# input's buffer with the output's shape (NC4HW4 is logically NCHW here), and nothing runs per step.
VIEW_OPS = ("Reshape", "Squeeze", "Unsqueeze", "ConvertTensor", "Identity")


def reshape_dims(node, inputs) -> list[int]:
    """The target dims of a Reshape: from its shape input, else its param."""
    return [int(d) for d in (inputs[1] if len(inputs) > 1 else node.param.dims)]


def reshape_shape(in_shape, dims) -> tuple[int, ...]:
    out = [in_shape[i] if d == 0 and i < len(in_shape) else d for i, d in enumerate(dims)]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        total = int(np.prod(in_shape, dtype=np.int64))
        out[out.index(-1)] = total // known if known else 0
    return tuple(out)


def reshape(node, inputs):
    return inputs[0].reshape(reshape_shape(inputs[0].shape, reshape_dims(node, inputs)))


def reshape_rule(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    x = inputs[0]
    dims = reshape_dims(node, [x, *host_values(node, inputs, 1)])
    return [(reshape_shape(x.shape, dims), x.dtype)]


def identity(node, inputs):
    return inputs[0]


def squeeze_axes(node, inputs, rank: int, shape) -> list[int]:
    axes = list(inputs[1]) if len(inputs) > 1 else list(getattr(node.param, "squeezeDims", None) or [])
    if not axes:
        return [i for i, d in enumerate(shape) if d == 1]
    return [int(a) % rank for a in axes]


def squeeze(node, inputs):
    x = inputs[0]
    return np.squeeze(x, axis=tuple(squeeze_axes(node, inputs, x.ndim, x.shape)))


def unsqueeze(node, inputs):
    x = inputs[0]
    axes = list(inputs[1]) if len(inputs) > 1 else list(node.param.squeezeDims)
    out_rank = x.ndim + len(axes)
    shape = list(x.shape)
    for axis in sorted(int(a) % out_rank for a in axes):
        shape.insert(axis, 1)
    return x.reshape(shape)


def _onnx_slice(node, inputs):
    x, starts, ends = inputs[0], inputs[1], inputs[2]
    axes = inputs[3] if len(inputs) > 3 else range(len(starts))
    steps = inputs[4] if len(inputs) > 4 else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[int(axis) % x.ndim] = slice(int(start), int(end), int(step))
    return x[tuple(index)]


def _tf_strided_slice(node, inputs):
    x, begin, end = inputs[0], inputs[1], inputs[2]
    strides = inputs[3] if len(inputs) > 3 else [1] * len(begin)
    p = node.param
    index, axis = [], 0
    for i in range(len(begin)):
        bit = 1 << i
        if p.ellipsisMask & bit:
            remaining = x.ndim - axis - (len(begin) - i - 1)
            index.extend([slice(None)] * remaining)
            axis += remaining
            continue
        if p.newAxisMask & bit:
            index.append(None)
            continue
        if p.shrinkAxisMask & bit:
            index.append(int(begin[i]))
        else:
            start = None if p.beginMask & bit else int(begin[i])
            stop = None if p.endMask & bit else int(end[i])
            index.append(slice(start, stop, int(strides[i])))
        axis += 1
    return x[tuple(index)]


def strided_slice(node, inputs):
    if getattr(node.param, "fromType", 0) == 1:
        return _onnx_slice(node, inputs)
    return _tf_strided_slice(node, inputs)


def gather(node, inputs):
    params, indices = inputs[0], inputs[1]
    axis = int(np.asarray(inputs[2]).reshape(-1)[0]) if len(inputs) > 2 else int(getattr(node.param, "axis", 0) or 0)
    indices = np.asarray(indices)
    idx = np.where(indices < 0, indices + params.shape[axis], indices)
    return np.take(params, idx, axis=axis)


def gather_rule(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    params, indices = inputs[0].shape, inputs[1].shape
    axis = int(np.asarray(host_values(node, inputs, 2)[0]).reshape(-1)[0]) if len(inputs) > 2 else 0
    axis %= len(params)
    return [(params[:axis] + indices + params[axis + 1:], inputs[0].dtype)]


def concat(node, inputs):
    axis = int(node.param.axis) if node.param is not None else 0
    return np.concatenate(inputs, axis=axis)


def concat_rule(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    axis = int(node.param.axis) % len(inputs[0].shape)
    shape = list(inputs[0].shape)
    shape[axis] = sum(t.shape[axis] for t in inputs)
    return [(tuple(shape), inputs[0].dtype)]


def slice_lengths(node, inputs, extent: int) -> list[int]:
    """The lengths of Slice's pieces along its axis, as MNN's shape rule reads its table: a CAFFE
    table's slicePoints are the cut positions; otherwise the lengths come from input 1 or slicePoints
    (one of them -1: the rest), or a single slicePoint is TORCH's piece length or TF's piece count."""
    points = [int(p) for p in (np.asarray(inputs[1]).reshape(-1) if len(inputs) > 1 else node.param.slicePoints or [])]
    source = node.param.sourceType
    if source == "CAFFE":
        cuts = [0, *points, extent]
        return [end - start for start, end in pairwise(cuts)]
    if len(inputs) == 1 and len(points) == 1:
        length = points[0] if source == "TORCH" else extent // points[0]
        return [length] * (extent // length)
    if not points:
        raise ModelFormatError("Slice: expected its piece lengths (input 1 or slicePoints); the equal split into "
                               "as many pieces as the op has outputs is not implemented", field=node.name)
    if points.count(-1) == 1:
        points[points.index(-1)] = extent - sum(p for p in points if p != -1)
    if min(points) < 0 or sum(points) > extent:
        raise ModelFormatError(f"Slice: expected piece lengths that fit the axis' {extent}, got {points}",
                               field=node.name)
    return points


def split(node, inputs):
    """MNN's Slice: x cut along `axis` into consecutive pieces (one output each, a tuple)."""
    x = inputs[0]
    axis = int(node.param.axis) % x.ndim
    lengths = slice_lengths(node, inputs, x.shape[axis])
    starts = np.cumsum([0, *lengths[:-1]])
    lead = (slice(None),) * axis
    return tuple(x[(*lead, slice(int(start), int(start) + length))] for start, length in zip(starts, lengths))


# ---- the vision encoders' data movement (Qwen2-VL's patch embedding: Conv3d as MNN exports it) ----
def slice_tf(node, inputs):
    """TF Slice: x[begin : begin + size] on each axis; a size of -1 runs to the end."""
    x, begin, size = inputs[0], np.asarray(inputs[1]).reshape(-1), np.asarray(inputs[2]).reshape(-1)
    index = tuple(slice(int(b), None if int(s) < 0 else int(b) + int(s)) for b, s in zip(begin, size))
    return x[index]


def transpose(node, inputs):
    return np.transpose(inputs[0], [int(a) for a in np.asarray(inputs[1]).reshape(-1)])


def permute(node, inputs):
    return np.transpose(inputs[0], [int(a) for a in node.param.dims])


def _broadcast_shape(x_shape, dims) -> tuple[int, ...]:
    """BroadcastTo's output (ONNX Expand): the input and the given dims broadcast both ways."""
    return tuple(int(d) for d in np.broadcast_shapes(tuple(x_shape), tuple(int(d) for d in dims)))


def broadcast_to(node, inputs):
    x, dims = inputs[0], inputs[1]
    return np.ascontiguousarray(np.broadcast_to(x, _broadcast_shape(x.shape, dims)))


def broadcast_rule(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    dims, = host_values(node, inputs, 1)
    return [(_broadcast_shape(inputs[0].shape, dims), inputs[0].dtype)]


def unpack(node, inputs):
    """Split along `axis` into its slices, that axis removed: one output per slice (a tuple)."""
    x = inputs[0]
    axis = int(node.param.axis) % x.ndim
    return tuple(np.take(x, i, axis=axis) for i in range(x.shape[axis]))


ROWS = {
    "Reshape": OpType(reshape_rule, reshape, param="Reshape", param_required=WITHOUT_SECOND_INPUT),
    "ConvertTensor": OpType(same, identity, param="TensorConvertInfo"),
    "Identity": OpType(same, identity),
    "Squeeze": OpType(evaluated(squeeze), squeeze, param="SqueezeParam"),
    "Unsqueeze": OpType(evaluated(unsqueeze), unsqueeze, param="SqueezeParam", param_required=WITHOUT_SECOND_INPUT),
    "StridedSlice": OpType(evaluated(strided_slice), strided_slice, param="StridedSliceParam", param_required=ALWAYS,
                           min_inputs=3),
    "GatherV2": OpType(gather_rule, gather, param="GatherV2", min_inputs=2),
    "Gather": OpType(gather_rule, gather, min_inputs=2),
    "Concat": OpType(concat_rule, concat, param="Axis", param_required=ALWAYS),
    "SliceTf": OpType(evaluated(slice_tf), slice_tf, min_inputs=3),
    "Slice": OpType(evaluated(split), split, param="Slice", param_required=ALWAYS),
    "Transpose": OpType(evaluated(transpose), transpose, min_inputs=2),
    "Permute": OpType(evaluated(permute), permute, param="Permute", param_required=ALWAYS),
    "Unpack": OpType(evaluated(unpack), unpack, param="Axis", param_required=ALWAYS),
    "BroadcastTo": OpType(broadcast_rule, broadcast_to, min_inputs=2),
}
