"""LinearAttention on the CPU (mnngpu/ops/linear_attention.py): the short convolution (LFM2) and the
gated delta rule (Qwen3.5), with each layer's state kept in the backend's `state_caches` (a
backend.kv.HostStateCache).

A forward takes its rows all at once: the short convolution is `kernel` shifted multiply-adds over
the rows (no loop over tokens); the delta rule runs in backends/cpu/kernels/linear_attention.py's
kernels, the tokens looped in compiled code, a v head per thread. On a fixed-shape backend's
padded prefill chunk only the first KVMeta.add rows are real; only they enter the state.

`_run_sequence(state, meta, start, rows)` is one sequence's part of a forward: its rows, its KVMeta
and its state. onExecute runs it once over all rows with the backend's own.

Rollback (backend.kv.state_step): in a forward KVMeta marks `verify`, the state cache keeps the
state from before it and the forward's real input rows. When the next forward removes r of its n
rows, the layer puts that state back and runs the first n - r rows again, through the same kernel
as a forward of those rows, so the state is the one such a forward leaves, bit for bit. Any other
forward drops what was kept.
"""

from __future__ import annotations

import numpy as np

from mnngpu import jit
from mnngpu.backend.kv import HostStateCache, KVMeta, state_step
from mnngpu.backend.sequences import segments
from mnngpu.backends.cpu.kernels.linear_attention import (
    CHUNK,
    conv_silu_rows,
    delta_rule_rows,
    delta_rule_rows_serial,
)
from mnngpu.backends.cpu.ops.base import CPUExecution
from mnngpu.ops.linear_attention import GATED_DELTA_RULE, state_shapes, token_rows

SERIAL_ROWS = 4   # up to this many rows (decode, a short verify block) the delta rule runs on one thread

__all__ = ["CHUNK", "CPULinearAttention", "gated_delta_rule", "short_conv"]


def causal_conv(padded: np.ndarray, weight: np.ndarray, seq: int) -> np.ndarray:
    """(channels, seq): the depthwise convolution over padded (channels, kernel - 1 + seq), the taps
    summed in order as MNN does."""
    acc = padded[:, :seq] * weight[:, :1]
    for tap in range(1, weight.shape[1]):
        acc += padded[:, tap: tap + seq] * weight[:, tap: tap + 1]
    return acc


def short_conv(qkv: np.ndarray, weight: np.ndarray, conv_state: np.ndarray, rows: int,
               out: np.ndarray, padded: np.ndarray) -> None:
    """LFM2's short convolution over one sequence.

    qkv (3 * channels, seq) holds b, c and x; weight (channels, kernel); conv_state (channels,
    kernel - 1) the previous inputs b * x, advanced in place by the first `rows` steps; out
    (seq, channels) = c * conv(b * x); padded (channels, kernel - 1 + seq) a work array."""
    channels, history = weight.shape[0], weight.shape[1] - 1
    seq = qkv.shape[1]
    b, c, x = qkv[:channels], qkv[channels: 2 * channels], qkv[2 * channels:]
    padded[:, :history] = conv_state
    np.multiply(b, x, out=padded[:, history:])
    acc = causal_conv(padded, weight, seq)
    acc *= c
    out[...] = acc.T
    conv_state[...] = padded[:, rows: rows + history]


def gated_delta_rule(qkv: np.ndarray, weight: np.ndarray, gate: np.ndarray, beta: np.ndarray,
                     parts: dict[str, np.ndarray], param, rows: int, out: np.ndarray) -> None:
    """Qwen3.5's Gated DeltaNet core over one sequence: qkv (channels, seq) holds q, k and v before
    the SiLU'd causal convolution; weight (channels, kernel); gate and beta (seq, num_v_heads);
    parts the layer's "conv" and "recurrent" state, advanced by the first `rows` tokens; out (seq,
    num_v_heads * head_v_dim), zero past `rows`."""
    seq, channels = qkv.shape[1], qkv.shape[0]
    work = (np.empty((weight.shape[1] - 1 + seq, channels), np.float32), np.empty((seq, channels), np.float32))
    delta_rule_layer(qkv.T, np.ascontiguousarray(weight.T), gate, beta, parts, param, rows, out, work)


def delta_rule_layer(qkv_rows: np.ndarray, weight_taps: np.ndarray, gate: np.ndarray, beta: np.ndarray,
                     parts: dict[str, np.ndarray], param, rows: int, out: np.ndarray,
                     work: tuple[np.ndarray, np.ndarray]) -> None:
    """gated_delta_rule over token rows: qkv_rows (seq, channels), weight_taps (kernel, channels);
    work the convolution's padded input (kernel - 1 + seq, channels) and its output (seq, channels)."""
    padded, mixed = work
    conv_args = (qkv_rows, weight_taps, parts["conv"], rows, padded, mixed)
    jit.runnable(conv_silu_rows, conv_args)(*conv_args)
    rule_args = (mixed, gate, beta, parts["recurrent"], param.num_k_heads, bool(param.use_qk_l2norm), rows, out)
    kernel = delta_rule_rows_serial if rows <= SERIAL_ROWS else delta_rule_rows
    jit.runnable(kernel, rule_args)(*rule_args)


class CPULinearAttention(CPUExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        shape = inputs[0].shape
        if not token_rows(shape) and shape[0] != 1:
            return f"LinearAttention over a batch of {shape[0]} sequences (the CPU kernel takes one)"
        return None

    def plan(self, inputs, outputs):
        shape = inputs[0].shape
        self.rows_first = token_rows(shape)   # (seq, channels, 1, 1), else (1, channels, seq)
        self.seq, self.channels = (shape[0], shape[1]) if self.rows_first else (shape[2], shape[1])
        self.kernel = inputs[3].shape[2]
        self.shapes = state_shapes(self.node.param, self.kernel)
        self.delta_rule = self.node.param.attn_type == GATED_DELTA_RULE

    def bind(self):
        qkv = self.value(self.inputs[0])
        self.qkv = qkv.reshape(self.seq, self.channels).T if self.rows_first else qkv.reshape(self.channels, self.seq)
        self.weight = np.ascontiguousarray(self.value(self.inputs[3]), dtype=np.float32).reshape(-1, self.kernel)
        self.weight_taps = np.ascontiguousarray(self.weight.T)
        self.out = self.outputs[0].device.reshape(self.seq, -1)
        self.gate = self.beta = None   # the short convolution reads neither
        if self.delta_rule:
            self.gate = self.value(self.inputs[1]).reshape(self.seq, -1)
            self.beta = self.value(self.inputs[2]).reshape(self.seq, -1)

    def onExecute(self, inputs, outputs):
        for segment in segments(self.backend, self.seq):   # a batched forward: each sequence's rows with its state
            start, rows = (0, self.seq) if segment is None else (segment.start, segment.rows)
            state = self.backend._state_cache(self.node.name, self.shapes)
            self._run_sequence(state, self.backend.kv_meta, start, rows)

    def _run_sequence(self, state: HostStateCache, meta: KVMeta | None, start: int, rows: int) -> None:
        """One sequence's rows start..start + rows of this forward, with its KVMeta and its state:
        the state starts over, or first takes back the rows meta removes; then the rows (the first
        meta.add of them real) advance it, kept for a rollback in a verify forward."""
        if not state_step(meta, self.node.name, state.undoable):
            state.reset()
        elif meta.remove:
            self._take_back(state, meta.remove)
        span = slice(start, start + rows)
        qkv, out = self.qkv[:, span], self.out[span]
        gate, beta = (self.gate[span], self.beta[span]) if self.delta_rule else (None, None)
        real = min(meta.add, rows) if meta is not None else rows
        if meta is not None and meta.verify:
            state.remember((qkv[:, :real], gate[:real], beta[:real]) if self.delta_rule else (qkv[:, :real],))
        else:
            state.forget()
        self._advance(state, qkv, gate, beta, real, out)

    def _advance(self, state: HostStateCache, qkv, gate, beta, rows: int, out: np.ndarray) -> None:
        """Run the layer over qkv's columns (the first `rows` real), advancing `state`; into out."""
        seq = qkv.shape[1]
        if self.delta_rule:
            work = (self.backend._scratch("delta_rule_padded", (self.kernel - 1 + seq, qkv.shape[0])),
                    self.backend._scratch("delta_rule_mixed", (seq, qkv.shape[0])))
            delta_rule_layer(qkv.T, self.weight_taps, gate, beta, state.parts, self.node.param, rows, out, work)
            return
        padded = self.backend._scratch("short_conv", (self.weight.shape[0], self.kernel - 1 + seq))
        short_conv(qkv, self.weight, state.parts["conv"], rows, out, padded)

    def _take_back(self, state: HostStateCache, dropped: int) -> None:
        """Roll the state back to the end of the last forward's first n - dropped rows: the state
        from before it, then those rows again (their output unused)."""
        qkv, *gate_beta = state.rows
        kept = qkv.shape[1] - dropped
        state.write(state.before)   # which also forgets
        if kept:
            gate, beta = (part[:kept] for part in gate_beta) if gate_beta else (None, None)
            self._advance(state, qkv[:, :kept], gate, beta, kept, np.empty((kept, self.out.shape[1]), np.float32))


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"LinearAttention": CPULinearAttention}
