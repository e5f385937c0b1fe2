"""Elementwise ops: BinaryOp (numpy broadcasting), UnaryOp, ReLU6 (a clamp), Cast and Eltwise.

BINARY and UNARY give each MNN opType its numpy semantics; BINARY_CODES and UNARY_CODES are the
numbers the device kernels switch on (shaders/vulkan/{binary,unary}.comp and
shaders/cuda/elementwise.cu take these codes; the OpenCL kernels are named after the ops).
Aliases share a code (MNN has two spellings of division, max and min).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.ops.common import ALWAYS, DTYPES, FLOAT, INT, OpType, Shape, same

if TYPE_CHECKING:
    from mnngpu.backend import Node, Tensor

BINARY_CODES = {"ADD": 0, "SUB": 1, "MUL": 2, "REALDIV": 3, "DIV": 3, "MAXIMUM": 4, "MAX_TEMP": 4,
                "MINIMUM": 5, "MIN_TEMP": 5, "POW": 6, "SquaredDifference": 7, "MUL_SILU": 8, "ATAN2": 9,
                "FLOORDIV": 10, "MOD": 11, "FLOORMOD": 11, "GREATER": 12, "GREATER_EQUAL": 13, "LESS": 14,
                "LESS_EQUAL": 15, "EQUAL": 16, "NOTEQUAL": 17}
UNARY_CODES = {"ABS": 0, "NEG": 1, "FLOOR": 2, "CEIL": 3, "SQUARE": 4, "SQRT": 5, "RSQRT": 6, "EXP": 7,
               "LOG": 8, "SIN": 9, "COS": 10, "TAN": 11, "ASIN": 12, "ACOS": 13, "ATAN": 14, "RECIPROCAL": 15,
               "TANH": 16, "SIGMOID": 17, "SILU": 18, "SIGN": 19, "ROUND": 20, "ERF": 21, "GELU": 22,
               "GELU_STANDARD": 23}


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _divide(a, b):
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return (np.trunc(a / b)).astype(INT)  # C integer division truncates toward zero
    return a / b


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def _erf(x):
    from math import erf
    return np.vectorize(erf, otypes=[FLOAT])(x)


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
    "SILU": _silu, "SIGN": np.sign, "ROUND": np.round, "ERF": _erf, "GELU": _gelu_tanh,
    "GELU_STANDARD": lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0))),
}

ELTWISE = {"SUM": np.add, "PROD": np.multiply, "MAXIMUM": np.maximum, "SUB": np.subtract}


def _keep_dtype(result, like):
    if np.issubdtype(like.dtype, np.integer) and result.dtype == np.bool_:
        return result.astype(INT)
    return result.astype(like.dtype, copy=False)


def binary_op(node, inputs):
    func = BINARY.get(node.param.opType)
    if func is None:
        raise ModelFormatError(f"BinaryOp type {node.param.opType} is not supported", field=node.name)
    a, b = inputs[0], inputs[1]
    return _keep_dtype(np.asarray(func(a, b)), a)


def unary_op(node, inputs):
    func = UNARY.get(node.param.opType)
    if func is None:
        raise ModelFormatError(f"UnaryOp type {node.param.opType} is not supported", field=node.name)
    x = inputs[0]
    return np.asarray(func(x)).astype(x.dtype, copy=False)


def relu6(node, inputs):
    """MNN's ReLU6 is a clamp to [minValue, maxValue] (0 and 6 by default; an exported Clip sets them)."""
    x = inputs[0]
    return np.clip(x, node.param.minValue, node.param.maxValue).astype(x.dtype, copy=False)


def cast(node, inputs):
    return inputs[0].astype(DTYPES.get(node.param.dstT, FLOAT))


def eltwise(node, inputs):
    p = node.param
    if p.coeff is not None and len(p.coeff) and not np.all(np.asarray(p.coeff) == 1):
        raise ModelFormatError("an Eltwise with unit coefficients; weighted sums are not implemented",
                               field=f"{node.name}.coeff")
    result = inputs[0]
    for other in inputs[1:]:
        result = ELTWISE[p.type](result, other)
    return result


def binary_rule(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    return [(tuple(np.broadcast_shapes(inputs[0].shape, inputs[1].shape)), inputs[0].dtype)]


def cast_rule(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    return [(inputs[0].shape, DTYPES.get(node.param.dstT, FLOAT))]


def eltwise_rule(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    return [(np.broadcast_shapes(*(t.shape for t in inputs)), inputs[0].dtype)]


ROWS = {
    "BinaryOp": OpType(binary_rule, binary_op, param="BinaryOp", param_required=ALWAYS, min_inputs=2),
    "UnaryOp": OpType(same, unary_op, param="UnaryOp", param_required=ALWAYS),
    "ReLU6": OpType(same, relu6, param="Relu6", param_required=ALWAYS),
    "Cast": OpType(cast_rule, cast, param="CastParam", param_required=ALWAYS),
    "Eltwise": OpType(eltwise_rule, eltwise, param="Eltwise", param_required=ALWAYS, min_inputs=2),
}
