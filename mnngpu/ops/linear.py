"""Linear layers: Convolution (a quantized or float 1x1 linear layer, a patch embedding, or a
sliding window), MatMul of two inputs, Im2Col, and the engine's fused LinearGroup (q, k, v on one
input) and GatedLinear (up * silu(gate)) nodes (runtime/fusion.py).

A Convolution's weights are decoded at load by format/quant.read_linear (IDST int4/int8 codes,
scales, zeros, bias); its `external` entry in the weight file is
[offset, weight_bytes, alpha_bytes, bias_bytes, sparse_index_bytes] (quantized) or
[offset, weight_bytes, bias_bytes] (float).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.format.quant import QuantizedLinear, read_linear  # noqa: F401 (a backend packs QuantizedLinear)
from mnngpu.ops.common import ALWAYS, FLOAT, FUSED_PREFIX, OpType, Shape, evaluated, rewritten_at_load

if TYPE_CHECKING:
    from mnngpu.backend import Node, Tensor
    from mnngpu.format.weights import WeightFile

LINEAR_GROUP, GATED_LINEAR = FUSED_PREFIX + "LinearGroup", FUSED_PREFIX + "GatedLinear"


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


def _convolution_shape(node: Node, inputs: list[Tensor]) -> Shape:
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
    out = (x[0], common.outputCount, *conv_output_size(common, *x[2:], *((1,) if len(x) == 3 else ())))
    return out[:len(x)]   # as MNN, a 3-D [n, c, h] input is [n, c, h, 1] and its output keeps three axes


def convolution(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    return [(_convolution_shape(node, inputs), FLOAT)]


def convolution_weights(weights: WeightFile | None, param, name: str) -> dict:
    return {"weight": read_linear(weights, param, name)}


def linear_group(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """A fused node of Convolutions on one input: one output per member."""
    return [convolution(member, inputs[:1])[0] for member in node.param.members]


def gated_linear(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """up * silu(gate): the members' common output."""
    return linear_group(node, inputs)[:1]


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


def matmul_rule(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    a, b = (list(t.shape) for t in inputs[:2])
    if node.param is not None and node.param.transposeA:
        a[-2:] = a[-1], a[-2]
    if node.param is not None and node.param.transposeB:
        b[-2:] = b[-1], b[-2]
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        raise ModelFormatError(f"MatMul of {inputs[0].shape} and {inputs[1].shape}: inner sizes differ",
                               field=node.name)
    return [((*np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])), a[-2], b[-1]), inputs[0].dtype)]


ROWS = {
    "Convolution": OpType(convolution, param="Convolution2D", param_required=ALWAYS, weights=convolution_weights),
    "FusedLinear": OpType(rewritten_at_load, param="FusedLinearParam", param_required=ALWAYS,
                          runs_as="Convolution"),
    "MatMul": OpType(matmul_rule, matmul, param="MatMul", min_inputs=2),
    "Im2Col": OpType(evaluated(im2col), im2col, param="Convolution2D", param_required=ALWAYS),
    LINEAR_GROUP: OpType(linear_group, fuses="Convolutions reading the same input (q, k, v)"),
    GATED_LINEAR: OpType(gated_linear, fuses="MUL_SILU(up(x), gate(x)) of two Convolutions"),
}


@dataclass
class FusedLinearParam:
    members: list[Node]   # Convolution nodes; GatedLinear: [gate, up]
