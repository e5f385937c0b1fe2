"""BinaryOp and UnaryOp on the CPU, writing into their planned output buffers.

The common float BinaryOps and UnaryOps call a numpy ufunc with `out=` (MUL_SILU and GELU a numba kernel);
the rarer types fall back to their host rule (mnngpu/ops/elementwise.py), as every other op
without a kernel here does (ops/base.py's CPUHostOp).
"""

from __future__ import annotations

import numpy as np

from mnngpu import jit
from mnngpu.backends.cpu.kernels import fastmath
from mnngpu.backends.cpu.ops.base import CPUHostOp

UFUNCS = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "REALDIV": np.divide,
          "MAXIMUM": np.maximum, "MINIMUM": np.minimum}
UNARY_UFUNCS = {"NEG": np.negative, "COS": np.cos, "SIN": np.sin, "EXP": np.exp, "SQRT": np.sqrt,
                "ABS": np.abs, "TANH": np.tanh, "SQUARE": np.square}


class CPUBinary(CPUHostOp):
    def bind(self):
        super().bind()
        a, b = self.args
        op = self.node.param.opType
        floats = self.out.dtype == np.float32 and a.dtype == np.float32 and b.dtype == np.float32
        self.ufunc = UFUNCS.get(op) if floats else None
        self.silu = floats and op == "MUL_SILU" and a.shape == b.shape == self.out.shape
        if self.silu:
            self.silu_times = jit.runnable(fastmath.silu_times, self._silu_args())

    def _silu_args(self) -> tuple:
        return self.args[0].reshape(-1), self.args[1].reshape(-1), self.out.reshape(-1)

    def onExecute(self, inputs, outputs):  # noqa: N802
        if self.ufunc is not None:
            self.ufunc(self.args[0], self.args[1], out=self.out)
        elif self.silu:
            self.silu_times(*self._silu_args())
        else:
            super().onExecute(inputs, outputs)


class CPUUnary(CPUHostOp):
    def bind(self):
        super().bind()
        floats = self.out.dtype == np.float32 and self.args[0].dtype == np.float32
        self.ufunc = UNARY_UFUNCS.get(self.node.param.opType) if floats else None
        x = self.args[0]
        self.gelu = (floats and self.node.param.opType == "GELU" and x.shape == self.out.shape
                     and x.flags.c_contiguous and self.out.flags.c_contiguous and not np.shares_memory(x, self.out))
        if self.gelu:
            self.gelu_tanh = jit.runnable(fastmath.gelu_tanh, self._flat())

    def _flat(self) -> tuple:
        return self.args[0].reshape(-1), self.out.reshape(-1)

    def onExecute(self, inputs, outputs):  # noqa: N802
        if self.ufunc is not None:
            self.ufunc(self.args[0], out=self.out)
        elif self.gelu:
            self.gelu_tanh(*self._flat())
        else:
            super().onExecute(inputs, outputs)


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"BinaryOp": CPUBinary, "UnaryOp": CPUUnary}
