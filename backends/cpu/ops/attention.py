"""MNN's fused Attention op on the CPU, with the KV cache kept inside the backend.

Inputs: q (1, seq, heads, head_dim), k (1, seq, kv_heads, head_dim), v (same values, any
layout with seq first), mask. The mask input is not read: like MNN's CPU kernel, the op masks
causally itself, from how many tokens the cache already holds (KVMeta).

Decode (one query row) is a numba loop over the heads. Prefill multiplies with BLAS per KV
head and block of queries, `QUERY_BLOCK` rows at a time, so the score matrix stays small.
"""

from __future__ import annotations

import numba
import numpy as np

from mnngpu import jit
from mnngpu.backends.cpu.execution import CPUExecution
from mnngpu.backends.cpu.ops import fastmath
from mnngpu.runtime.kv import attention_scale, grown_capacity, reserve_moves

QUERY_BLOCK = 128   # query positions per prefill score tile


KV_STEP = 256   # cache capacity grows by half, in multiples of this many tokens


def _zeros(shape: tuple[int, ...]) -> np.ndarray:
    return np.zeros(shape, dtype=np.float32)


class KVCache:
    """One layer's keys and values: (kv_heads, capacity, head_dim) float32, grown by half.
    `zeros(shape)` makes each array (in a file under tmp_path with kvcache_mmap)."""

    def __init__(self, kv_heads: int, head_dim: int, capacity: int = KV_STEP, zeros=_zeros):
        self.zeros = zeros
        self.k = zeros((kv_heads, capacity, head_dim))
        self.v = zeros((kv_heads, capacity, head_dim))

    def ensure(self, length: int) -> None:
        capacity = grown_capacity(self.k.shape[1], length, KV_STEP)
        if capacity == self.k.shape[1]:
            return
        for name in ("k", "v"):
            old = getattr(self, name)
            grown = self.zeros((old.shape[0], capacity, old.shape[2]))
            grown[:, : old.shape[1]] = old
            setattr(self, name, grown)

    def read(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the first `length` keys and values."""
        return self.k[:, :length].copy(), self.v[:, :length].copy()

    def write(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Hold exactly these keys and values, (kv_heads, length, head_dim) each."""
        length = keys.shape[1]
        self.ensure(length)
        self.k[:, :length] = keys
        self.v[:, :length] = values

    def apply_reserve(self, start: int, reserve: list[tuple[int, int]]) -> int:
        """Move the kept spans of a removed region together behind `start`; returns the new end."""
        moves, end = reserve_moves(start, reserve)
        for move in moves:
            for cache in (self.k, self.v):
                cache[:, move.target: move.target + move.length] = \
                    cache[:, move.source: move.source + move.length].copy()
        return end


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def attend_one(q, keys, values, total, scale, scores, out):
    """One query row, heads over the threads. q, out [heads, dim]; keys, values [kv_heads, capacity,
    dim]; scores [heads, >= total] work space."""
    heads, dim = q.shape
    group = heads // keys.shape[0]
    for h in numba.prange(heads):
        g = h // group
        best = np.float32(-np.inf)
        for t in range(total):
            s = np.float32(0.0)
            for i in range(dim):
                s += q[h, i] * keys[g, t, i]
            s *= scale
            scores[h, t] = s
            best = max(best, s)
        norm = np.float32(0.0)
        for t in range(total):
            e = fastmath.exp(scores[h, t] - best)
            scores[h, t] = e
            norm += e
        for i in range(dim):
            out[h, i] = 0.0
        for t in range(total):
            p = scores[h, t] / norm
            for i in range(dim):
                out[h, i] += p * values[g, t, i]


@numba.njit(fastmath=True, cache=True, nogil=True)
def causal_softmax(scores, rows_per_query, first_visible):
    """scores [queries*rows_per_query, total] in place; row r sees keys [0, first_visible + r // rows_per_query]."""
    for r in range(scores.shape[0]):
        visible = first_visible + r // rows_per_query
        best = np.float32(-np.inf)
        for t in range(visible):
            best = max(best, scores[r, t])
        norm = np.float32(0.0)
        for t in range(visible):
            e = fastmath.exp(scores[r, t] - best)
            scores[r, t] = e
            norm += e
        inv = np.float32(1.0) / norm
        for t in range(visible):
            scores[r, t] *= inv
        for t in range(visible, scores.shape[1]):
            scores[r, t] = 0.0


@jit.twin_of(attend_one)
def attend_one_numpy(q, keys, values, total, scale, scores, out):
    group = q.shape[0] // keys.shape[0]
    k = np.repeat(keys[:, :total], group, axis=0)      # (heads, total, dim)
    v = np.repeat(values[:, :total], group, axis=0)
    s = np.einsum("hd,htd->ht", q, k) * np.float32(scale)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    out[:] = np.einsum("ht,htd->hd", p, v)


@jit.twin_of(causal_softmax)
def causal_softmax_numpy(scores, rows_per_query, first_visible):
    visible = first_visible + np.arange(scores.shape[0]) // rows_per_query
    seen = np.arange(scores.shape[1])[None, :] < visible[:, None]
    masked = np.where(seen, scores, -np.inf)
    e = np.exp(masked - masked.max(axis=1, keepdims=True))
    scores[:] = e / e.sum(axis=1, keepdims=True)


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, past: int, scale: float,
           out: np.ndarray, parallel=None) -> None:
    """q (seq, heads, d); keys/values (kv_heads, >= past+seq, d) -> out (seq, heads, d), causal."""
    seq, heads, dim = q.shape
    kv_heads = keys.shape[0]
    group = heads // kv_heads
    # the last query blocks see the most keys: they go first, so the threads finish together
    blocks = [(g, start) for start in reversed(range(0, seq, QUERY_BLOCK)) for g in range(kv_heads)]

    def block(index: int) -> None:
        g, start = blocks[index]
        stop = min(seq, start + QUERY_BLOCK)
        visible = past + stop
        # (queries, group, d) -> rows ordered query-major, so r // group is the query offset
        rows = np.ascontiguousarray(q[start:stop, g * group:(g + 1) * group]).reshape(-1, dim)
        scores = rows @ keys[g, :visible].T
        scores *= np.float32(scale)
        softmax_args = (scores, group, past + start + 1)
        jit.runnable(causal_softmax, softmax_args)(*softmax_args)
        out[start:stop, g * group:(g + 1) * group] = (scores @ values[g, :visible]).reshape(stop - start, group, dim)

    if parallel is None:
        for index in range(len(blocks)):
            block(index)
    else:
        parallel(block, len(blocks))


class CPUAttention(CPUExecution):
    def prepare(self, inputs, outputs):
        _, self.seq, self.heads, self.dim = inputs[0].shape
        self.kv_heads = inputs[1].shape[2]
        self.scale = np.float32(attention_scale(self.node.param.attnScale, self.dim, self.backend.kv_meta))

    def bind(self):
        seq, kvh, dim = self.seq, self.kv_heads, self.dim
        self.q = self.value(self.inputs[0]).reshape(seq, self.heads, dim)
        self.k_new = self.value(self.inputs[1]).reshape(seq, kvh, dim).transpose(1, 0, 2)
        self.v_new = self.value(self.inputs[2]).reshape(seq, kvh, dim).transpose(1, 0, 2)
        self.out = self.outputs[0].device.reshape(seq, self.heads, dim)
        self.attend_one = None

    def onExecute(self, inputs, outputs):  # noqa: N802
        cache = self._cache()
        meta = self.backend.kv_meta
        past = cache.apply_reserve(meta.previous - meta.remove, meta.reserve)
        cache.ensure(past + self.seq)
        cache.k[:, past: past + self.seq] = self.k_new
        cache.v[:, past: past + self.seq] = self.v_new
        if self.seq == 1:
            scores = self.backend.scratch("attention_scores", (self.heads, past + 1))
            args = (self.q[0], cache.k, cache.v, past + 1, self.scale, scores, self.out[0])
            if self.attend_one is None:   # the same argument types every step
                self.attend_one = jit.runnable(attend_one, args)
            self.attend_one(*args)
        else:
            attend(self.q, cache.k, cache.v, past, self.scale, self.out, self.backend.parallel)

    def _cache(self) -> KVCache:
        layer = self.node.param.layer_index
        caches = self.backend.kv_caches
        if layer not in caches:
            caches[layer] = KVCache(self.kv_heads, self.dim, zeros=self.backend.kv_zeros)
        return caches[layer]
