"""numba kernels of LinearAttention's gated delta rule (Qwen3.5; mnngpu/ops/linear_attention.py), with
their numpy twins (the stand-ins while they compile, and a second, chunked form of the same math).

Rows are tokens: the kernels take q, k and v as (seq, channels) rows, which is how the exporter's
graph lays them out inside MNN's fused transformer region.

* conv_silu_rows: the depthwise causal convolution over the previous kernel - 1 inputs (the layer's
  "conv" state) and this forward's, then SiLU. Tokens outer, channels inner, so the products run
  along a row in vector instructions.
* delta_rule_rows: the recurrence itself, one v head per thread, the tokens looped inside compiled
  code (delta_rule_rows_serial: the same on one thread, for a decode step). Per token the (head_k_dim, head_v_dim) state is read twice: once for S^T k, once to decay
  it, add k delta^T and take S^T q in the same sweep. A 128 x 128 head state (64 KB) stays in the
  core's cache from one token to the next, so a prefill costs about what its arithmetic does; a
  chunked (WY) form would trade that for matrix products and a triangular solve per chunk, which
  the numpy twin does, where a token loop in Python would be the slow part.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from mnngpu import jit
from mnngpu.backends.cpu.kernels import fastmath
from mnngpu.backends.cpu.kernels.intrinsics import rint
from mnngpu.ops import linear_attention

L2_EPSILON = np.float32(linear_attention.L2_EPSILON)   # under the root when q and k are normalised
CHUNK = 64   # tokens the numpy twin solves together: its triangular solve grows as CHUNK ** 2
_SILU_EXP_MAX = np.float32(80.0)   # as fastmath.silu_times: a finite divisor keeps the division vectorized
_KERNEL = {"fastmath": True, "cache": True, "nogil": True, **fastmath.VECTOR_DIVISION}
_EXP_LOW, _EXP_HIGH = np.float32(-87.0), np.float32(88.0)   # 2^n stays a normal float32
_LOG2E, _LN2 = np.float32(1.4426950408889634), np.float32(0.6931471805599453)
_TAYLOR = tuple(np.float32(1.0 / f) for f in (1, 1, 2, 6, 24, 120, 720, 5040))
_I32 = ir.IntType(32)


@intrinsic
def _pow2(typingctx, n):
    """2.0 ** n for a whole float32 n in [-126, 127], from its exponent bits: a loop vectorizes it."""
    if n != types.float32:
        return None

    def codegen(context, builder, signature, args):
        biased = builder.add(builder.fptosi(args[0], _I32), ir.Constant(_I32, 127))
        return builder.bitcast(builder.shl(biased, ir.Constant(_I32, 23)), ir.FloatType())

    return types.float32(types.float32), codegen


@numba.njit(inline="always", fastmath=True, cache=True)
def exp(x):
    """e^x to about 2 ulp, in vector instructions: 2^n e^r with n = rint(x / ln 2), |r| <= ln 2 / 2
    and e^r by its Taylor series to the 7th power. fastmath.exp's repeated squaring leaves 5e-5,
    which the convolution's SiLU feeds into q and k: a prefill in pieces then drifted from a whole
    one by more than the model's other kernels do."""
    x = min(max(x, _EXP_LOW), _EXP_HIGH)
    n = rint(x * _LOG2E)
    r = x - n * _LN2
    y = _TAYLOR[7]
    for c in (_TAYLOR[6], _TAYLOR[5], _TAYLOR[4], _TAYLOR[3], _TAYLOR[2], _TAYLOR[1], _TAYLOR[0]):
        y = y * r + c
    return y * _pow2(n)


@numba.njit(**_KERNEL)
def conv_silu_rows(qkv, weight_taps, conv_state, rows, padded, out):
    """out (seq, channels) = SiLU(causal conv) of qkv (seq, channels, any strides); weight_taps
    (kernel, channels); conv_state (channels, kernel - 1) the inputs before this forward, advanced in
    place to the first `rows` tokens; padded (kernel - 1 + seq, channels) a work array. The taps are
    summed in order, as MNN does."""
    seq, channels = qkv.shape
    kernel = weight_taps.shape[0]
    history = kernel - 1
    for j in range(history):
        for c in range(channels):
            padded[j, c] = conv_state[c, j]
    for t in range(seq):
        source, target = qkv[t], padded[history + t]
        for c in range(channels):
            target[c] = source[c]
    for t in range(seq):
        acc = out[t]
        first, w = padded[t], weight_taps[0]
        for c in range(channels):
            acc[c] = first[c] * w[c]
        for tap in range(1, kernel):
            x, w = padded[t + tap], weight_taps[tap]
            for c in range(channels):
                acc[c] += x[c] * w[c]
        for c in range(channels):
            acc[c] = acc[c] / (np.float32(1.0) + exp(min(-acc[c], _SILU_EXP_MAX)))
    for j in range(history):
        source = padded[rows + j]
        for c in range(channels):
            conv_state[c, j] = source[c]


@jit.twin_of(conv_silu_rows)
def conv_silu_rows_numpy(qkv, weight_taps, conv_state, rows, padded, out):
    history, seq = conv_state.shape[1], qkv.shape[0]
    padded[:history] = conv_state.T
    padded[history:] = qkv
    acc = padded[:seq] * weight_taps[0]
    for tap in range(1, weight_taps.shape[0]):
        acc += padded[tap: tap + seq] * weight_taps[tap]
    with np.errstate(over="ignore"):
        out[...] = acc / (np.float32(1.0) + np.exp(-acc))
    conv_state[...] = padded[rows: rows + history].T


@numba.njit(inline="always", **_KERNEL)
def _scaled_head(row, start, l2norm, scale, into):
    """into = row[start:start + into.size] * scale, divided by its norm first with l2norm."""
    width = into.size
    norm = np.float32(1.0)
    if l2norm:
        total = np.float32(0.0)
        for i in range(width):
            total += row[start + i] * row[start + i]
        norm = np.float32(1.0) / np.sqrt(total + L2_EPSILON)
    for i in range(width):
        into[i] = row[start + i] * norm * scale


@numba.njit(inline="always", **_KERNEL)
def _delta_rule_head(mixed, gate, beta, state, num_k_heads, l2norm, rows, out, h):
    """delta_rule_rows' v head h (shapes as there)."""
    heads, k_dim, v_dim = state.shape
    keys = num_k_heads * k_dim
    scale = np.float32(1.0 / np.sqrt(k_dim))
    q, k = np.empty(k_dim, np.float32), np.empty(k_dim, np.float32)
    delta, acc = np.empty(v_dim, np.float32), np.empty(v_dim, np.float32)
    s = state[h]
    g_start, v_start = (h // (heads // num_k_heads)) * k_dim, 2 * keys + h * v_dim
    for t in range(rows):
        row = mixed[t]
        _scaled_head(row, g_start, l2norm, scale, q)
        _scaled_head(row, keys + g_start, l2norm, np.float32(1.0), k)
        decay = np.float32(np.exp(gate[t, h]))
        acc[:] = 0.0
        for i in range(k_dim):
            ki, si = k[i], s[i]
            for j in range(v_dim):
                acc[j] += si[j] * ki
        b = beta[t, h]
        for j in range(v_dim):
            delta[j] = b * (row[v_start + j] - decay * acc[j])
        acc[:] = 0.0
        for i in range(k_dim):
            ki, qi, si = k[i], q[i], s[i]
            for j in range(v_dim):
                updated = decay * si[j] + ki * delta[j]
                si[j] = updated
                acc[j] += updated * qi
        target = out[t]
        for j in range(v_dim):
            target[h * v_dim + j] = acc[j]
    for t in range(rows, out.shape[0]):
        target = out[t]
        for j in range(v_dim):
            target[h * v_dim + j] = 0.0


@numba.njit(parallel=True, **_KERNEL)
def delta_rule_rows(mixed, gate, beta, state, num_k_heads, l2norm, rows, out):
    """The gated delta rule over token rows, a v head per thread: mixed (seq, channels) holds q and k
    (num_k_heads * head_k_dim each) and v after the convolution; gate and beta (seq, v heads); state
    (v heads, head_k_dim, head_v_dim) advanced in place by the first `rows` tokens; out (seq, v heads *
    head_v_dim), zero past `rows`. v head h reads k head h // (v heads / num_k_heads)."""
    for h in numba.prange(state.shape[0]):
        _delta_rule_head(mixed, gate, beta, state, num_k_heads, l2norm, rows, out, h)


@numba.njit(**_KERNEL)
def delta_rule_rows_serial(mixed, gate, beta, state, num_k_heads, l2norm, rows, out):
    """delta_rule_rows on the calling thread, for a few rows (a decode step: 14 heads of 128 x 128
    take 50 us, about what waking the other threads costs, and far less on a busy machine)."""
    for h in range(state.shape[0]):
        _delta_rule_head(mixed, gate, beta, state, num_k_heads, l2norm, rows, out, h)


def _unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2_EPSILON)


@jit.twin_of(delta_rule_rows)
@jit.twin_of(delta_rule_rows_serial)
def delta_rule_rows_numpy(mixed, gate, beta, state, num_k_heads, l2norm, rows, out):
    """delta_rule_rows in its chunked form (delta_rule_chunk), CHUNK tokens at a time."""
    heads, k_dim, _ = state.shape
    keys = num_k_heads * k_dim
    out[rows:] = 0.0
    if rows == 0:
        return

    def split(block: np.ndarray, count: int) -> np.ndarray:   # (rows, count * dim) -> (heads, rows, dim)
        return np.repeat(block.reshape(rows, count, -1).transpose(1, 0, 2), heads // count, axis=0)

    q = split(mixed[:rows, :keys], num_k_heads)
    k = split(mixed[:rows, keys: 2 * keys], num_k_heads)
    v = np.ascontiguousarray(mixed[:rows, 2 * keys:].reshape(rows, heads, -1).transpose(1, 0, 2))
    if l2norm:
        q, k = _unit_rows(q), _unit_rows(k)
    q = q * np.float32(1.0 / np.sqrt(k_dim))
    gate_t, beta_t = np.ascontiguousarray(gate[:rows].T), np.ascontiguousarray(beta[:rows].T)
    pieces = [delta_rule_chunk(q[:, s: s + CHUNK], k[:, s: s + CHUNK], v[:, s: s + CHUNK], gate_t[:, s: s + CHUNK],
                               beta_t[:, s: s + CHUNK], state) for s in range(0, rows, CHUNK)]
    out[:rows] = np.concatenate(pieces, axis=1).transpose(1, 0, 2).reshape(rows, -1)


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
