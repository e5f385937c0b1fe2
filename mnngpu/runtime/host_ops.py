"""Numpy semantics of MNN's data-movement and elementwise ops, written once: one function
(node, input values) -> output value per op type, named in runtime/op_table.py.

Placement uses these to fold ops whose inputs are all known on the host (shape arithmetic,
constants); the CPU backend runs the same functions on real activations.
Layouts are logical NCHW: an NC4HW4 tensor holds the same values, so ConvertTensor is the
identity here.
"""

from __future__ import annotations

import numpy as np

from mnngpu.errors import ModelFormatError

FLOAT = np.float32
INT = np.int32
DTYPES = {"DT_FLOAT": FLOAT, "DT_INT32": INT, "DT_INT64": INT, "DT_BOOL": INT, "DT_HALF": FLOAT,
          "DT_BFLOAT16": FLOAT, "DT_DOUBLE": FLOAT, "DT_UINT8": INT, "DT_INT8": INT}


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _divide(a, b):
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return (np.trunc(a / b)).astype(INT)  # C integer division truncates toward zero
    return a / b


BINARY = {
    "ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "REALDIV": _divide, "DIV": _divide,
    "FLOORDIV": np.floor_divide, "MOD": np.mod, "FLOORMOD": np.mod, "POW": np.power,
    "MAXIMUM": np.maximum, "MINIMUM": np.minimum, "MAX_TEMP": np.maximum, "MIN_TEMP": np.minimum,
    "SquaredDifference": lambda a, b: (a - b) ** 2,
    "GREATER": np.greater, "GREATER_EQUAL": np.greater_equal, "LESS": np.less, "LESS_EQUAL": np.less_equal,
    "EQUAL": np.equal, "NOTEQUAL": np.not_equal, "ATAN2": np.arctan2,
    "MUL_SILU": lambda a, b: a * _silu(b),  # MNN: input0 * silu(input1)
}

UNARY = {
    "ABS": np.abs, "NEG": np.negative, "FLOOR": np.floor, "CEIL": np.ceil, "SQUARE": np.square,
    "SQRT": np.sqrt, "RSQRT": lambda x: 1.0 / np.sqrt(x), "EXP": np.exp, "LOG": np.log,
    "SIN": np.sin, "COS": np.cos, "TAN": np.tan, "ASIN": np.arcsin, "ACOS": np.arccos, "ATAN": np.arctan,
    "RECIPROCAL": lambda x: 1.0 / x, "TANH": np.tanh, "SIGMOID": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "SILU": _silu, "SIGN": np.sign, "ROUND": np.round, "ERF": None, "GELU": None, "GELU_STANDARD": None,
}


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def _erf(x):
    from math import erf
    return np.vectorize(erf, otypes=[FLOAT])(x)


UNARY["GELU"] = _gelu_tanh
UNARY["ERF"] = _erf
UNARY["GELU_STANDARD"] = lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def _keep_dtype(result, like):
    if np.issubdtype(like.dtype, np.integer) and result.dtype == np.bool_:
        return result.astype(INT)
    return result.astype(like.dtype, copy=False)


def binary(node, a, b):
    func = BINARY.get(node.param.opType)
    if func is None:
        raise ModelFormatError(f"BinaryOp type {node.param.opType} is not supported", field=node.name)
    return _keep_dtype(np.asarray(func(a, b)), a)


def unary(node, x):
    func = UNARY.get(node.param.opType)
    if func is None:
        raise ModelFormatError(f"UnaryOp type {node.param.opType} is not supported", field=node.name)
    return np.asarray(func(x)).astype(x.dtype, copy=False)


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


def concat(node, inputs):
    axis = int(node.param.axis) if node.param is not None else 0
    return np.concatenate(inputs, axis=axis)


def cast(node, inputs):
    return inputs[0].astype(DTYPES.get(node.param.dstT, FLOAT))


def shape_stand_in(tensor) -> np.ndarray:
    """A zero-cost array with a tensor's shape, for ops whose result depends only on shapes."""
    return np.broadcast_to(np.zeros((), dtype=tensor.dtype), tensor.shape)


def shape(node, inputs):
    return np.array(inputs[0].shape, dtype=INT)


def rank(node, inputs):
    return np.array(inputs[0].ndim, dtype=INT)


def size(node, inputs):
    return np.array(inputs[0].size, dtype=INT)


def reshape(node, inputs):
    return inputs[0].reshape(reshape_shape(inputs[0].shape, reshape_dims(node, inputs)))


def identity(node, inputs):
    return inputs[0]


def binary_op(node, inputs):
    return binary(node, inputs[0], inputs[1])


def unary_op(node, inputs):
    return unary(node, inputs[0])


def softmax(node, inputs):
    x = inputs[0].astype(FLOAT, copy=False)
    axis = int(node.param.axis) if node.param is not None else -1
    shifted = np.exp(x - x.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)


def matmul(node, inputs):
    p = node.param
    if p is not None and (p.weight is not None or p.bias is not None):
        raise ModelFormatError("a MatMul of its two inputs; one holding its own weight is not implemented",
                               field=f"{node.name}.weight")
    a, b = inputs[0], inputs[1]
    if p is not None and p.transposeA:
        a = np.swapaxes(a, -1, -2)
    if p is not None and p.transposeB:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


def pooling(node, inputs):
    """Max or average pooling of [n, c, h, w] (a 3-D [n, c, h] input is [n, c, h, 1] and its
    output keeps three axes), over whole windows without padding."""
    p, x = node.param, inputs[0]
    if p.isGlobal or p.padType != "CAFFE" or p.padX or p.padY or any(p.pads or ()):
        raise ModelFormatError("an unpadded, non-global Pooling (padType CAFFE); padded and global pooling are "
                               "not implemented", field=f"{node.name}.pads")
    shaped = x.reshape(*x.shape, 1) if x.ndim == 3 else x
    h, w = shaped.shape[2:]
    oh, ow = (h - p.kernelY) // p.strideY + 1, (w - p.kernelX) // p.strideX + 1
    if p.ceilModel and ((h - p.kernelY) % p.strideY or (w - p.kernelX) % p.strideX):
        raise ModelFormatError("a Pooling whose windows tile its input (ceilModel with a partial last window is "
                               "not implemented)", field=f"{node.name}.ceilModel")
    windows = np.stack([shaped[:, :, ky: ky + p.strideY * (oh - 1) + 1: p.strideY,
                               kx: kx + p.strideX * (ow - 1) + 1: p.strideX]
                        for ky in range(p.kernelY) for kx in range(p.kernelX)])
    pooled = windows.max(axis=0) if p.type == "MAXPOOL" else windows.mean(axis=0, dtype=np.float32)
    return pooled.astype(x.dtype, copy=False).reshape(pooled.shape[:3] if x.ndim == 3 else pooled.shape)


def top_k_axis(inputs, rank: int) -> tuple[int, int]:
    """(k, axis) of a TopKV2: k from input 1, the axis from input 2, else the last."""
    k = int(np.asarray(inputs[1]).reshape(-1)[0])
    axis = int(np.asarray(inputs[2]).reshape(-1)[0]) if len(inputs) > 2 else rank - 1
    return k, axis % rank


def top_k(node, inputs):
    """(values, indices int32) of the k largest (smallest with largest=false) along the axis,
    best first; equal values keep the lower index first."""
    x = inputs[0]
    k, axis = top_k_axis(inputs, x.ndim)
    largest = getattr(node.param, "largest", True) if node.param is not None else True
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    indices = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, indices, axis=axis), indices.astype(INT)


REDUCE = {"SUM": np.sum, "MEAN": np.mean, "MAXIMUM": np.max, "MINIMUM": np.min, "PROD": np.prod,
          "ASUM": lambda x, axis, keepdims: np.abs(x).sum(axis=axis, keepdims=keepdims),
          "SUMSQ": lambda x, axis, keepdims: np.square(x).sum(axis=axis, keepdims=keepdims)}


def reduction_axes(node, inputs, rank: int) -> tuple[int, ...]:
    """A Reduction's axes: from input 1, else the param's dim; none given means every axis."""
    axes = np.asarray(inputs[1]).reshape(-1) if len(inputs) > 1 else (node.param.dim or [])
    return tuple(sorted({int(a) % rank for a in axes})) if len(axes) else tuple(range(rank))


def reduction(node, inputs):
    x = inputs[0]
    func = REDUCE.get(node.param.operation)
    if func is None:
        raise ModelFormatError(f"Reduction operation {node.param.operation} is not supported", field=node.name)
    axes = reduction_axes(node, inputs, x.ndim)
    return np.asarray(func(x, axis=axes, keepdims=bool(node.param.keepDims))).astype(x.dtype, copy=False)


def expert_add(node, inputs):
    """The engine's EXPERT_ADD node (runtime/moe.py): [acc +] w * y, where w per token is the
    routing weight the router gave expert `param.expert` (zero where it did not select it)."""
    y, weights, selected = inputs[:3]
    top_k = node.param.top_k
    chosen = selected.reshape(-1, top_k) == node.param.expert
    w = np.where(chosen, weights.reshape(-1, top_k), 0).sum(axis=1).astype(FLOAT)
    out = y * w[:, None]
    return out + inputs[3] if len(inputs) > 3 else out


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


def unpack(node, inputs):
    """Split along `axis` into its slices, that axis removed: one output per slice (a tuple)."""
    x = inputs[0]
    axis = int(node.param.axis) % x.ndim
    return tuple(np.take(x, i, axis=axis) for i in range(x.shape[axis]))


ELTWISE = {"SUM": np.add, "PROD": np.multiply, "MAXIMUM": np.maximum, "SUB": np.subtract}


def eltwise(node, inputs):
    p = node.param
    if p.coeff is not None and len(p.coeff) and not np.all(np.asarray(p.coeff) == 1):
        raise ModelFormatError("an Eltwise with unit coefficients; weighted sums are not implemented",
                               field=f"{node.name}.coeff")
    result = inputs[0]
    for other in inputs[1:]:
        result = ELTWISE[p.type](result, other)
    return result


def conv_window(common):
    """(kh, kw, sh, sw, dh, dw, top, left, bottom, right) of a Convolution2DCommon."""
    if common.pads is not None and len(common.pads) == 4:
        top, left, bottom, right = (int(v) for v in common.pads)
    else:
        top = bottom = int(common.padY)
        left = right = int(common.padX)
    return (common.kernelY, common.kernelX, common.strideY, common.strideX, common.dilateY, common.dilateX,
            top, left, bottom, right)


def conv_output_size(common, height: int, width: int) -> tuple[int, int]:
    """(oh, ow) of a convolution window sliding over an [h, w] input (MNN's explicit pads)."""
    kh, kw, sh, sw, dh, dw, top, left, bottom, right = conv_window(common)
    return ((height + top + bottom - dh * (kh - 1) - 1) // sh + 1,
            (width + left + right - dw * (kw - 1) - 1) // sw + 1)


def is_pointwise(common) -> bool:
    """A 1x1 convolution with stride 1 and no padding: a linear layer at each position."""
    kh, kw, sh, sw, _, _, top, left, bottom, right = conv_window(common)
    return (kh, kw, sh, sw) == (1, 1, 1, 1) and not (top or left or bottom or right)


def is_windowed(common, in_shape) -> bool:
    """A convolution that slides its window (not a 1x1 per-position linear layer, nor a patch
    embedding whose window covers its whole unpadded input)."""
    if is_pointwise(common):
        return False
    kh, kw, _, _, _, _, top, left, bottom, right = conv_window(common)
    return tuple(in_shape[2:]) != (kh, kw) or bool(top or left or bottom or right)


def im2col(node, inputs):
    """[n, c, h, w] -> [c*kh*kw, n*oh*ow]: row c*kh*kw + ky*kw + kx, column (n, oy, ox)."""
    x = inputs[0]
    kh, kw, sh, sw, dh, dw, top, left, bottom, right = conv_window(node.param.common)
    oh, ow = conv_output_size(node.param.common, *x.shape[2:])
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, c = x.shape[:2]
    cols = np.empty((c, kh, kw, n, oh, ow), dtype=x.dtype)
    for ky in range(kh):
        for kx in range(kw):
            rows = x[:, :, ky * dh: ky * dh + sh * (oh - 1) + 1: sh, kx * dw: kx * dw + sw * (ow - 1) + 1: sw]
            cols[:, ky, kx] = rows.transpose(1, 0, 2, 3)
    return cols.reshape(c * kh * kw, n * oh * ow)

