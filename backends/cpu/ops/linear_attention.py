"""LinearAttention on the CPU (mnngpu/ops/linear_attention.py): the short convolution (LFM2) and the
gated delta rule (Qwen3.5), with each layer's state kept in the backend's `state_caches` (a
runtime.kv.HostStateCache).

A forward takes its rows all at once: the convolution is `kernel` shifted multiply-adds over the
rows (no loop over tokens), and the delta rule runs in chunks of CHUNK tokens (`delta_rule_chunk`:
a few matrix products and one triangular solve per chunk, all heads together). On a fixed-shape
backend's padded prefill chunk only the first KVMeta.add rows are real; only they enter the state.

Rollback (runtime.kv.state_step): in a forward KVMeta marks `verify`, the state cache keeps the
state from before it and the forward's real input rows. When the next forward removes r of its n
rows, the layer puts that state back and runs the first n - r rows again, through the same kernel
as a forward of those rows, so the state is the one such a forward leaves, bit for bit. Any other
forward drops what was kept.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backends.cpu.ops.base import CPUExecution
from mnngpu.ops.linear_attention import GATED_DELTA_RULE, L2_EPSILON, state_shapes, token_rows
from mnngpu.runtime.kv import HostStateCache, state_step

CHUNK = 64   # tokens of the delta rule solved together: the triangular solve grows as CHUNK ** 2


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


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x / (np.float32(1.0) + np.exp(-x))


def delta_rule_chunk(q: np.ndarray, k: np.ndarray, v: np.ndarray, gate: np.ndarray, beta: np.ndarray,
                     state: np.ndarray) -> np.ndarray:
    """The gated delta rule over n tokens at once, per head: q, k (heads, n, head_k_dim), v (heads, n,
    head_v_dim), gate and beta (heads, n); state (heads, head_k_dim, head_v_dim) advanced in place.
    Returns (heads, n, head_v_dim).

    With G the running sum of the gates, token t's delta depends on the earlier deltas through
    A[t, i] = beta_t exp(G_t - G_i) k_t . k_i (i < t), so (I + A) delta = beta (v - exp(G) k S0):
    one unit lower triangular solve. Then out = exp(G) q S0 + (exp(G_t - G_i) q_t . k_i, i <= t) delta,
    and S = exp(G_n) S0 + sum_i exp(G_n - G_i) k_i delta_i^T."""
    n = q.shape[1]
    total = np.cumsum(gate, axis=1)                                      # G (heads, n)
    lower = np.tril(np.ones((n, n), dtype=bool))
    spread = np.where(lower, total[:, :, None] - total[:, None, :], -np.inf)
    decay = np.exp(spread)                                               # exp(G_t - G_i), 0 above the diagonal
    keys = k @ k.transpose(0, 2, 1)
    strict = decay * keys * beta[:, :, None]
    strict[:, np.arange(n), np.arange(n)] = 0.0
    grown = np.exp(total)[:, :, None]
    target = beta[:, :, None] * (v - grown * (k @ state))
    deltas = np.linalg.solve(strict + np.eye(n, dtype=q.dtype), target)
    out = grown * (q @ state) + (decay * (q @ k.transpose(0, 2, 1))) @ deltas
    tail = np.exp(total[:, -1:] - total)[:, :, None]                     # exp(G_n - G_i)
    state *= np.exp(total[:, -1])[:, None, None]
    state += (k * tail).transpose(0, 2, 1) @ deltas
    return out


def delta_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, gate: np.ndarray, beta: np.ndarray,
               state: np.ndarray) -> np.ndarray:
    """delta_rule_chunk over any number of tokens, CHUNK at a time (shapes as there)."""
    n = q.shape[1]
    if n == 1:
        return delta_rule_step(q[:, 0], k[:, 0], v[:, 0], gate[:, 0], beta[:, 0], state)[:, None]
    return np.concatenate([delta_rule_chunk(q[:, s: s + CHUNK], k[:, s: s + CHUNK], v[:, s: s + CHUNK],
                                            gate[:, s: s + CHUNK], beta[:, s: s + CHUNK], state)
                           for s in range(0, n, CHUNK)], axis=1)


def delta_rule_step(q: np.ndarray, k: np.ndarray, v: np.ndarray, gate: np.ndarray, beta: np.ndarray,
                    state: np.ndarray) -> np.ndarray:
    """One token (a decode step): q, k (heads, head_k_dim), v (heads, head_v_dim), gate and beta
    (heads,); returns (heads, head_v_dim)."""
    state *= np.exp(gate)[:, None, None]
    delta = beta[:, None] * (v - np.einsum("hkv,hk->hv", state, k))
    state += k[:, :, None] * delta[:, None, :]
    return np.einsum("hkv,hk->hv", state, q)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """x divided by the square root of its last axis' sum of squares plus L2_EPSILON."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + np.float32(L2_EPSILON))


def gated_delta_rule(qkv: np.ndarray, weight: np.ndarray, gate: np.ndarray, beta: np.ndarray,
                     parts: dict[str, np.ndarray], param, rows: int, out: np.ndarray) -> None:
    """Qwen3.5's Gated DeltaNet core over one sequence: qkv (channels, seq) holds q, k and v before
    the SiLU'd causal convolution; gate and beta (seq, num_v_heads); parts the layer's "conv" and
    "recurrent" state, advanced by the first `rows` tokens; out (seq, num_v_heads * head_v_dim)."""
    conv_state, seq = parts["conv"], qkv.shape[1]
    history = conv_state.shape[1]
    padded = np.concatenate([conv_state, qkv], axis=1)
    mixed = silu(causal_conv(padded, weight, seq))
    conv_state[...] = padded[:, rows: rows + history]
    out[rows:] = 0.0
    if rows == 0:
        return
    group = param.num_v_heads // param.num_k_heads
    keys = param.num_k_heads * param.head_k_dim

    def heads(block: np.ndarray, count: int) -> np.ndarray:   # (channels, rows) -> (heads, rows, dim)
        return np.ascontiguousarray(block[:, :rows].reshape(count, -1, rows).transpose(0, 2, 1))

    q = np.repeat(heads(mixed[:keys], param.num_k_heads), group, axis=0)
    k = np.repeat(heads(mixed[keys: 2 * keys], param.num_k_heads), group, axis=0)
    v = heads(mixed[2 * keys:], param.num_v_heads)
    if param.use_qk_l2norm:
        q, k = unit_rows(q), unit_rows(k)
    q *= np.float32(1.0 / np.sqrt(param.head_k_dim))
    result = delta_rule(q, k, v, np.ascontiguousarray(gate[:rows].T), np.ascontiguousarray(beta[:rows].T),
                        parts["recurrent"])
    out[:rows] = result.transpose(1, 0, 2).reshape(rows, -1)


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
        self.out = self.outputs[0].device.reshape(self.seq, -1)
        self.gate = self.beta = None   # the short convolution reads neither
        if self.delta_rule:
            self.gate = self.value(self.inputs[1]).reshape(self.seq, -1)
            self.beta = self.value(self.inputs[2]).reshape(self.seq, -1)

    def onExecute(self, inputs, outputs):  # noqa: N802
        meta = self.backend.kv_meta
        state = self.backend._state_cache(self.node.name, self.shapes)
        if not state_step(meta, self.node.name, state.undoable):
            state.reset()
        elif meta.remove:
            self._take_back(state, meta.remove)
        rows = min(meta.add, self.seq) if meta is not None else self.seq
        real = (self.qkv[:, :rows], self.gate[:rows], self.beta[:rows]) if self.delta_rule else (self.qkv[:, :rows],)
        if meta is not None and meta.verify:
            state.remember(real)
        else:
            state.forget()
        self._advance(state, self.qkv, self.gate, self.beta, rows, self.out)

    def _advance(self, state: HostStateCache, qkv, gate, beta, rows: int, out: np.ndarray) -> None:
        """Run the layer over qkv's columns (the first `rows` real), advancing `state`; into out."""
        if self.delta_rule:
            gated_delta_rule(qkv, self.weight, gate, beta, state.parts, self.node.param, rows, out)
            return
        padded = self.backend._scratch("short_conv", (self.weight.shape[0], self.kernel - 1 + qkv.shape[1]))
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
