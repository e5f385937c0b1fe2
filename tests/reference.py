"""Plain numpy references, one per op, written independently of mnngpu's own code.

tests/backend/ runs every op on every available backend against these.
"""

from __future__ import annotations

import numpy as np


def linear(x: np.ndarray, codes_unpacked: np.ndarray, scales: np.ndarray, zeros: np.ndarray,
           block: int, bias: np.ndarray | None = None) -> np.ndarray:
    """x [n, ic]; codes [oc, ic] unsigned levels; w = code*scale + zero per (row, block)."""
    w = codes_unpacked.astype(np.float64) * np.repeat(scales, block, axis=1) + np.repeat(zeros, block, axis=1)
    y = x.astype(np.float64) @ w.T
    return (y if bias is None else y + bias).astype(np.float32)


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps) * gamma).astype(np.float32)


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
    y = (x64 - mean) / np.sqrt(var + eps) * gamma
    return (y if beta is None else y + beta).astype(np.float32)


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, past: int, scale: float,
                     window: int = 0) -> np.ndarray:
    """q [seq, H, D]; k, v [past+seq, KVH, D] -> [seq, H, D]: query i sits at position past + i and sees
    keys up to it; with a window only keys j > past + i - window (MNN's sliding mask)."""
    seq, total = q.shape[0], k.shape[0]
    position = past + np.arange(seq)[:, None]
    keys = np.arange(total)[None, :]
    seen = (keys <= position) & ((window == 0) | (keys > position - window))
    return full_attention(q, k, v, np.where(seen, 0.0, -np.inf), scale)


def full_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float) -> np.ndarray:
    """q [seq, H, D]; k, v [total, KVH, D]; mask [seq, total] added to every head's scores
    -> [seq, H, D], one head and one query at a time."""
    seq, heads, _ = q.shape
    kv_heads = k.shape[1]
    out = np.zeros(q.shape, dtype=np.float64)
    for h in range(heads):
        g = h // (heads // kv_heads)
        for i in range(seq):
            scores = k[:, g].astype(np.float64) @ q[i, h].astype(np.float64) * scale + mask[i]
            p = np.exp(scores - scores.max())
            out[i, h] = (p / p.sum()) @ v[:, g]
    return out.astype(np.float32)


def im2col(x: np.ndarray, kh: int, kw: int, sh: int, sw: int) -> np.ndarray:
    """Unpadded, undilated im2col of [n, c, h, w]: [c*kh*kw, n*oh*ow], element by element."""
    n, c, h, w = x.shape
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    out = np.zeros((c * kh * kw, n * oh * ow), dtype=x.dtype)
    for ci in range(c):
        for ky in range(kh):
            for kx in range(kw):
                for b in range(n):
                    for oy in range(oh):
                        for ox in range(ow):
                            out[(ci * kh + ky) * kw + kx, (b * oh + oy) * ow + ox] = x[b, ci, oy * sh + ky, ox * sw + kx]
    return out


def silu_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """MNN's BinaryOp MUL_SILU: a * silu(b)."""
    b64 = b.astype(np.float64)
    return (a * b64 / (1 + np.exp(-b64))).astype(np.float32)


# ---- elementwise ops, by MNN's op type name (float64 math) ----------------------------------------------------

def _silu64(x):
    return x / (1.0 + np.exp(-x))


def _erf64(x):
    from math import erf
    return np.vectorize(erf)(x)


BINARY = {
    "ADD": lambda a, b: a + b, "SUB": lambda a, b: a - b, "MUL": lambda a, b: a * b,
    "REALDIV": lambda a, b: a / b, "DIV": lambda a, b: a / b, "FLOORDIV": lambda a, b: np.floor(a / b),
    "MOD": lambda a, b: a - np.floor(a / b) * b, "FLOORMOD": lambda a, b: a - np.floor(a / b) * b,
    "POW": lambda a, b: a ** b, "MAXIMUM": np.fmax, "MINIMUM": np.fmin, "MAX_TEMP": np.fmax, "MIN_TEMP": np.fmin,
    "SquaredDifference": lambda a, b: (a - b) * (a - b),
    "GREATER": lambda a, b: (a > b) * 1.0, "GREATER_EQUAL": lambda a, b: (a >= b) * 1.0,
    "LESS": lambda a, b: (a < b) * 1.0, "LESS_EQUAL": lambda a, b: (a <= b) * 1.0,
    "EQUAL": lambda a, b: (a == b) * 1.0, "NOTEQUAL": lambda a, b: (a != b) * 1.0,
    "ATAN2": np.arctan2, "MUL_SILU": lambda a, b: a * _silu64(b),
}

UNARY = {
    "ABS": np.abs, "NEG": lambda x: -x, "FLOOR": np.floor, "CEIL": np.ceil, "SQUARE": lambda x: x * x,
    "SQRT": np.sqrt, "RSQRT": lambda x: 1.0 / np.sqrt(x), "EXP": np.exp, "LOG": np.log, "SIN": np.sin,
    "COS": np.cos, "TAN": np.tan, "ASIN": np.arcsin, "ACOS": np.arccos, "ATAN": np.arctan,
    "RECIPROCAL": lambda x: 1.0 / x, "TANH": np.tanh, "SIGMOID": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "SILU": _silu64, "SIGN": np.sign, "ROUND": np.rint, "ERF": _erf64,
    "GELU": lambda x: 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3))),
    "GELU_STANDARD": lambda x: 0.5 * x * (1.0 + _erf64(x / np.sqrt(2.0))),
}


# ---- random quantized weights and the comparison, shared by tests/backend/ ---------------------------------

def random_levels(rng: np.random.Generator, oc: int, ic: int, bits: int, block: int):
    """(levels uint8 [oc, ic], scales, zeros float32 [oc, ic // block]) of an asymmetric quantized layer."""
    levels = rng.integers(0, 1 << bits, size=(oc, ic), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, size=(oc, ic // block)).astype(np.float32)
    zeros = (-(1 << (bits - 1)) * scales + rng.normal(0, 0.01, size=scales.shape)).astype(np.float32)
    return levels, scales, zeros


def integer_chunks(x: np.ndarray, levels: int = 32767, chunk: int = 64) -> np.ndarray:
    """x [rows, n] as an integer kernel sees it: every run of `chunk` values of a row rounded to
    the nearest multiple of its step, max|run| / levels (float32 arithmetic, as the kernel's)."""
    runs = np.asarray(x, dtype=np.float32).reshape(x.shape[0], -1, chunk)
    peak = np.abs(runs).max(axis=-1, keepdims=True)
    step = np.where(peak > 0, peak / np.float32(levels), np.float32(1.0)).astype(np.float32)
    rounded = np.rint(runs * (np.float32(1.0) / step))
    assert np.abs(rounded).max() <= levels
    return (rounded.astype(np.float64) * step).reshape(x.shape)


def pack_high_nibble_first(levels: np.ndarray) -> np.ndarray:
    """MNN's int4 byte order: element 2i in the high nibble of byte i."""
    return (levels[:, 0::2] << 4 | levels[:, 1::2]).astype(np.uint8)


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float) -> None:
    """Same shape, and the largest difference within rtol x the largest |want|."""
    want = np.asarray(want, dtype=np.float64)
    scale = max(float(np.abs(want).max()), 1e-6)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.abs(got - want).max() <= rtol * scale, np.abs(got - want).max() / scale


# ---- op patterns as the exporter writes them -------------------------------------------------------------

def rotate_half_graph(split: int, axis: int) -> tuple[list, dict[int, np.ndarray]]:
    """Tensors 0 x, 1 cos, 2 sin, 3..10 slice bounds; the exporter's 7 rotate-half ops -> tensor 17."""
    from mnngpu.backend import Node
    from mnngpu.format import params as P
    from mnngpu.runtime.pipeline import GraphOp

    bounds = {3: [split], 4: [1 << 30], 5: [axis], 6: [1], 7: [0], 8: [split], 9: [axis], 10: [1]}
    slice_param = P.StridedSliceParam(fromType=1)
    ops = [GraphOp(Node("BinaryOp", "mul_cos", P.BinaryOp(opType="MUL")), [0, 1], [11]),
           GraphOp(Node("StridedSlice", "hi", slice_param), [0, 3, 4, 5, 6], [12]),
           GraphOp(Node("UnaryOp", "neg", P.UnaryOp(opType="NEG")), [12], [13]),
           GraphOp(Node("StridedSlice", "lo", slice_param), [0, 7, 8, 9, 10], [14]),
           GraphOp(Node("Concat", "cat", P.Axis(axis=-1)), [13, 14], [15]),
           GraphOp(Node("BinaryOp", "mul_sin", P.BinaryOp(opType="MUL")), [15, 2], [16]),
           GraphOp(Node("BinaryOp", "add", P.BinaryOp(opType="ADD")), [11, 16], [17])]
    return ops, {i: np.array(v, dtype=np.int32) for i, v in bounds.items()}


# ---- the MoE router and the expert mixture ----------------------------------------------------------

def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def top_k_last_axis(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest of each last-axis row, best first, by repeated scans (ties: lower index first)."""
    rows = x.reshape(-1, x.shape[-1])
    values = np.zeros((len(rows), k), dtype=np.float64)
    indices = np.zeros((len(rows), k), dtype=np.int64)
    for r, row in enumerate(rows):
        taken: list[int] = []
        for pick in range(k):
            best = max((j for j in range(len(row)) if j not in taken), key=lambda j: (row[j], -j))
            taken.append(best)
            values[r, pick], indices[r, pick] = row[best], best
    shape = x.shape[:-1] + (k,)
    return values.reshape(shape), indices.reshape(shape)


def expert_mixture(outputs: list[np.ndarray], weights: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """Each token's row summed over its selected experts only, as MNN's MoE module runs it:
    outputs[e] (tokens, H) is expert e's output on every token."""
    tokens = outputs[0].shape[0]
    weights, selected = weights.reshape(tokens, -1), selected.reshape(tokens, -1)
    mixed = np.zeros(outputs[0].shape, dtype=np.float64)
    for t in range(tokens):
        for w, e in zip(weights[t], selected[t]):
            mixed[t] += w * outputs[e][t].astype(np.float64)
    return mixed


def gated_delta_net(qkv: np.ndarray, weight: np.ndarray, gate: np.ndarray, beta: np.ndarray, k_heads: int,
                    v_heads: int, k_dim: int, v_dim: int, conv_history: np.ndarray, state: np.ndarray,
                    l2norm: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Qwen3.5's Gated DeltaNet core one token at a time, in float64, as HF's recurrent form reads:
    qkv (channels, seq) before the depthwise causal conv (weight (channels, kernel), the previous
    kernel - 1 inputs in conv_history) and its SiLU; q, k, v split per head, v head h reading k head
    h * k_heads // v_heads; q and k l2-normalised (eps 1e-6 under the root), q scaled by 1/sqrt(k_dim);
    per token: decay the state by exp(gate), delta = beta (v - S^T k), S += k delta^T, out = S^T q.
    Returns the output (seq, v_heads * v_dim), the last kernel - 1 inputs and the state."""
    kernel = weight.shape[1]
    window = np.concatenate([conv_history, qkv], axis=1).astype(np.float64)
    S = state.astype(np.float64).copy()
    outputs = []
    for t in range(qkv.shape[1]):
        conv = (window[:, t: t + kernel] * weight).sum(axis=1)
        x = conv / (1.0 + np.exp(-conv))
        q_all = x[: k_heads * k_dim].reshape(k_heads, k_dim)
        k_all = x[k_heads * k_dim: 2 * k_heads * k_dim].reshape(k_heads, k_dim)
        v_all = x[2 * k_heads * k_dim:].reshape(v_heads, v_dim)
        row = []
        for h in range(v_heads):
            q, k = q_all[h * k_heads // v_heads], k_all[h * k_heads // v_heads]
            if l2norm:
                q, k = q / np.sqrt(q @ q + 1e-6), k / np.sqrt(k @ k + 1e-6)
            q = q / np.sqrt(k_dim)
            S[h] *= np.exp(gate[t, h])
            delta = beta[t, h] * (v_all[h] - S[h].T @ k)
            S[h] += np.outer(k, delta)
            row.append(S[h].T @ q)
        outputs.append(np.concatenate(row))
    return np.array(outputs), window[:, -(kernel - 1):], S
