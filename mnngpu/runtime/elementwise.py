"""The elementwise ops the device kernels implement, and the numbers their shaders switch on,
written once: shaders/vulkan/{binary,unary}.comp and shaders/cuda/elementwise.cu take these
codes; the OpenCL kernels are named after the ops. Aliases share a code (MNN has two spellings
of division, max and min)."""

from __future__ import annotations

BINARY_CODES = {"ADD": 0, "SUB": 1, "MUL": 2, "REALDIV": 3, "DIV": 3, "MAXIMUM": 4, "MAX_TEMP": 4,
                "MINIMUM": 5, "MIN_TEMP": 5, "POW": 6, "SquaredDifference": 7, "MUL_SILU": 8, "ATAN2": 9,
                "FLOORDIV": 10, "MOD": 11, "FLOORMOD": 11, "GREATER": 12, "GREATER_EQUAL": 13, "LESS": 14,
                "LESS_EQUAL": 15, "EQUAL": 16, "NOTEQUAL": 17}
UNARY_CODES = {"ABS": 0, "NEG": 1, "FLOOR": 2, "CEIL": 3, "SQUARE": 4, "SQRT": 5, "RSQRT": 6, "EXP": 7,
               "LOG": 8, "SIN": 9, "COS": 10, "TAN": 11, "ASIN": 12, "ACOS": 13, "ATAN": 14, "RECIPROCAL": 15,
               "TANH": 16, "SIGMOID": 17, "SILU": 18, "SIGN": 19, "ROUND": 20, "ERF": 21, "GELU": 22,
               "GELU_STANDARD": 23}
