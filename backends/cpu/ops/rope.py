"""The fused rotary embedding (runtime/fusion.py's ROPE node): one pass instead of seven ops.

    out = x * cos + rotate(x) * sin,   rotate(x) = concat(-x[..., s:], x[..., :s])
x (1, seq, heads, dim); cos, sin hold one row of `dim` per position, shared by the heads.
"""

from __future__ import annotations

import numba
import numpy as np

from mnngpu import jit
from mnngpu.backends.cpu.ops.base import CPUExecution
from mnngpu.ops.op_table import evaluate_rope_ops
from mnngpu.ops.rope import ROPE, rope_split


@numba.njit(fastmath=True, cache=True, nogil=True)
def rope_rotate_half(x, cos, sin, split, out):
    """x, out [seq, heads, dim]; cos, sin [seq, dim]."""
    dim = x.shape[2]
    tail = dim - split
    for s in range(x.shape[0]):
        for h in range(x.shape[1]):
            for i in range(tail):
                out[s, h, i] = x[s, h, i] * cos[s, i] - x[s, h, i + split] * sin[s, i]
            for i in range(tail, dim):
                out[s, h, i] = x[s, h, i] * cos[s, i] + x[s, h, i - tail] * sin[s, i]


@jit.twin_of(rope_rotate_half)
def rope_rotate_half_numpy(x, cos, sin, split, out):
    tail = x.shape[2] - split
    cos, sin = cos[:, None, :], sin[:, None, :]
    out[:, :, :tail] = x[:, :, :tail] * cos[:, :, :tail] - x[:, :, split:] * sin[:, :, :tail]
    out[:, :, tail:] = x[:, :, tail:] * cos[:, :, tail:] + x[:, :, :split] * sin[:, :, tail:]


class CPURoPE(CPUExecution):
    def plan(self, inputs, outputs):
        x, cos, sin = inputs[:3]
        self.split = rope_split(self.node, inputs)
        if len(x.shape) != 4 or x.shape[0] != 1:
            self.split = None
        else:
            row = (1, x.shape[1], 1, x.shape[3])
            if any(t.shape not in (row, row[1:]) for t in (cos, sin)):
                self.split = None   # not one (cos, sin) row per position: run the ops as exported

    def bind(self):
        values = [self.value(t) for t in self.inputs]
        self.out = self.outputs[0].device
        if self.split is None:
            self.args = values
            return
        x, cos, sin = values[:3]
        seq, heads, dim = x.shape[1:]
        self.args = (x.reshape(seq, heads, dim), cos.reshape(seq, dim), sin.reshape(seq, dim), self.split,
                     self.out.reshape(seq, heads, dim))
        self.rotate = jit.runnable(rope_rotate_half, self.args)

    def onExecute(self, inputs, outputs):  # noqa: N802
        if self.split is None:
            np.copyto(self.out, evaluate_rope_ops(self.node, self.args), casting="unsafe")
        else:
            self.rotate(*self.args)


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {ROPE: CPURoPE}
