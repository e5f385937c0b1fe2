"""The fused rotary embedding (the ROPE node of runtime/fusion.py and runtime/c4_ops.py): one pass
instead of seven ops.

    out = x * cos + rotate(x) * sin,   rotate(x) = concat(-x[..., s:], x[..., :s])
x (1, seq, heads, dim); cos, sin hold one row of `dim` per position, shared by the heads.
"""

from __future__ import annotations

import numba
import numpy as np

from mnngpu import jit
from mnngpu.backends.cpu.ops.base import CPUExecution
from mnngpu.ops.op_table import evaluate_rope_ops
from mnngpu.ops.rope import ROPE, rotary_width, rotate_half_split, rows_error


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
    """A partial rotation (MNN's RoPE with rope_cut_head_dim) rotates x[..., :rotary] and copies the rest."""

    def plan(self, inputs, outputs):
        self.split = rotate_half_split(self.node, inputs)   # None: run the ops as exported
        self.rotary = rotary_width(self.node, inputs[0])
        if self.split is None and not self.node.param.ops:
            raise rows_error(self.node, inputs)

    def bind(self):
        values = [self.value(t) for t in self.inputs]
        self.out = self.outputs[0].device
        if self.split is None:
            self.args = values
            return
        x, cos, sin = values[:3]
        seq, heads, dim = x.shape[1:]
        x, out, rotary = x.reshape(seq, heads, dim), self.out.reshape(seq, heads, dim), self.rotary
        self.kept = (out[:, :, rotary:], x[:, :, rotary:]) if rotary < dim else None
        self.args = (x[:, :, :rotary], cos.reshape(seq, rotary), sin.reshape(seq, rotary), self.split,
                     out[:, :, :rotary])
        self.rotate = jit.runnable(rope_rotate_half, self.args)

    def onExecute(self, inputs, outputs):  # noqa: N802
        if self.split is None:
            np.copyto(self.out, evaluate_rope_ops(self.node, self.args), casting="unsafe")
            return
        self.rotate(*self.args)
        if self.kept is not None:
            np.copyto(*self.kept)


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {ROPE: CPURoPE}
