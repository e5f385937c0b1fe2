"""Elementwise and data-movement ops on the CPU, writing into their planned output buffers.

The common float BinaryOps and UnaryOps call a numpy ufunc with `out=`; every other op (Cast,
Concat, StridedSlice, Gather, the rarer Binary/Unary types) evaluates the shared numpy
semantics of runtime/host_ops and copies the result into its buffer.
"""

from __future__ import annotations

import numpy as np

from mnngpu import jit
from mnngpu.backends.cpu.execution import CPUExecution
from mnngpu.backends.cpu.ops import fastmath
from mnngpu.runtime import op_table

UFUNCS = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "REALDIV": np.divide,
          "MAXIMUM": np.maximum, "MINIMUM": np.minimum}
UNARY_UFUNCS = {"NEG": np.negative, "COS": np.cos, "SIN": np.sin, "EXP": np.exp, "SQRT": np.sqrt,
                "ABS": np.abs, "TANH": np.tanh, "SQUARE": np.square}




class HostOpExecution(CPUExecution):
    """Any op of host_ops on activations: evaluate, then copy into the output buffer."""

    def bind(self):
        self.args = [self.value(t) for t in self.inputs]
        self.out = self.outputs[0].device
        self.outs = [t.device for t in self.outputs]

    def onExecute(self, inputs, outputs):  # noqa: N802
        for out, result in zip(self.outs, op_table.evaluate(self.node, self.args)):
            np.copyto(out, result, casting="unsafe")


class BinaryExecution(HostOpExecution):
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


class UnaryExecution(HostOpExecution):
    def bind(self):
        super().bind()
        floats = self.out.dtype == np.float32 and self.args[0].dtype == np.float32
        self.ufunc = UNARY_UFUNCS.get(self.node.param.opType) if floats else None

    def onExecute(self, inputs, outputs):  # noqa: N802
        if self.ufunc is not None:
            self.ufunc(self.args[0], out=self.out)
        else:
            super().onExecute(inputs, outputs)
