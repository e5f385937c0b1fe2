"""MNN's fused Attention op on the CPU, with the KV cache kept inside the backend.

Inputs: q (1, seq, heads, head_dim), k (1, seq, kv_heads, head_dim), v (same values, any
layout with seq first), mask. Like MNN's CPU kernel, the op masks causally itself, from how many
tokens the cache already holds (KVMeta); the mask input only names a key window (a sliding
layer of a mix export: runtime.attention_mask), which hides keys `window` or more positions back.

A decode step or a verify block (up to ROWS_KERNEL_MAX query rows) is a numba loop over the
heads, each row of a head in turn, the same arithmetic whatever the number of rows. Prefill multiplies with BLAS
per KV head and block of queries, `QUERY_BLOCK` rows at a time, so the score matrix stays small.
"""

from __future__ import annotations

import numba
import numpy as np

from mnngpu import jit
from mnngpu.backend.kv import attention_scale, grown_capacity, quantize_int8, reserve_moves
from mnngpu.backend.sequences import segments
from mnngpu.backends.cpu.kernels import fastmath
from mnngpu.backends.cpu.kernels.intrinsics import ROW_CHUNK, key_scores, weighted_rows
from mnngpu.backends.cpu.ops.base import CPUExecution
from mnngpu.ops.attention import key_window

# Query positions per prefill score tile: a tile's scores (32 queries x 7 heads of a KV head x
# 512 keys) stay in a 1 MB L2 between the two multiplies and the softmax; 128 did not, and took
# twice the time.
QUERY_BLOCK = 32
ROWS_KERNEL_MAX = 8  # up to this many query rows (decode, a verify block), attend_rows; more, BLAS


KV_STEP = 256   # cache capacity grows by half, in multiples of this many tokens


def _zeros(shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


class KVCache:
    """One layer's keys and values (a backend.kv.KVCache): (kv_heads, capacity, head_dim), grown by half.

    float32, or with `int8_keys` / `int8_values` (attention_mode 1 and 2, as MNN numbers them)
    int8 codes beside a float32 scale per head and token (`k_scale`, `v_scale`; all ones for a
    side kept in float32 once either is quantized). `zeros(shape, dtype)` makes each array (in a
    file under tmp_path with kvcache_mmap)."""

    def __init__(self, kv_heads: int, head_dim: int, capacity: int = KV_STEP, zeros=_zeros,
                 int8_keys: bool = False, int8_values: bool = False):
        self.zeros = zeros
        self.int8 = (int8_keys, int8_values)
        self.quantized = int8_keys or int8_values
        shape = (kv_heads, capacity, head_dim)
        self.k = zeros(shape, np.int8 if int8_keys else np.float32)
        self.v = zeros(shape, np.int8 if int8_values else np.float32)
        self.k_scale = self.v_scale = None
        self._ones = None   # scales() of a float cache, made once per capacity
        if self.quantized:
            self.k_scale = self._scales(shape[:2], int8_keys)
            self.v_scale = self._scales(shape[:2], int8_values)

    def _scales(self, shape: tuple[int, int], quantized: bool) -> np.ndarray:
        scales = self.zeros(shape, np.float32)
        if not quantized:
            scales[...] = 1.0
        return scales

    def scales(self) -> tuple[np.ndarray, np.ndarray]:
        """The key and value scales per head and token; for a float cache, ones (a broadcast view)."""
        if self.quantized:
            return self.k_scale, self.v_scale
        if self._ones is None or self._ones.shape != self.k.shape[:2]:
            self._ones = np.broadcast_to(np.float32(1.0), self.k.shape[:2])
        return self._ones, self._ones

    @property
    def kv_heads(self) -> int:
        return self.k.shape[0]

    @property
    def head_dim(self) -> int:
        return self.k.shape[2]

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.k, self.v, self.k_scale, self.v_scale) if a is not None)

    def reset(self) -> None:
        for name, int8 in (("k", self.int8[0]), ("v", self.int8[1])):
            getattr(self, name)[...] = 0
            scales = getattr(self, name + "_scale")
            if scales is not None:
                scales[...] = 0.0 if int8 else 1.0

    def ensure(self, length: int) -> None:
        capacity = grown_capacity(self.k.shape[1], length, KV_STEP)
        if capacity == self.k.shape[1]:
            return
        for name in ("k", "v", "k_scale", "v_scale"):
            old = getattr(self, name)
            if old is None:
                continue
            grown = self.zeros((old.shape[0], capacity, *old.shape[2:]), old.dtype)
            if name.endswith("scale") and not self.int8[name == "v_scale"]:
                grown[...] = 1.0
            grown[:, : old.shape[1]] = old
            setattr(self, name, grown)

    def store(self, start: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Put keys and values (kv_heads, tokens, head_dim) at positions start..; room must exist."""
        stop = start + keys.shape[1]
        if not self.quantized:
            self.k[:, start:stop] = keys
            self.v[:, start:stop] = values
            return
        for name, new, int8 in (("k", keys, self.int8[0]), ("v", values, self.int8[1])):
            if int8:
                codes, scales = quantize_int8(np.asarray(new, dtype=np.float32))
                getattr(self, name)[:, start:stop] = codes
                getattr(self, name + "_scale")[:, start:stop] = scales
            else:
                getattr(self, name)[:, start:stop] = new

    def floats(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """The first `length` keys and values as float32 (views when stored as float32)."""
        pairs = []
        for name, int8 in (("k", self.int8[0]), ("v", self.int8[1])):
            array = getattr(self, name)[:, :length]
            if int8:
                array = array.astype(np.float32) * getattr(self, name + "_scale")[:, :length, None]
            pairs.append(array)
        return pairs[0], pairs[1]

    def read(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the first `length` keys and values, as float32."""
        keys, values = self.floats(length)
        return np.array(keys, dtype=np.float32), np.array(values, dtype=np.float32)

    def write(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Hold exactly these keys and values, (kv_heads, length, head_dim) each."""
        self.ensure(keys.shape[1])
        self.store(0, keys, values)

    def apply_reserve(self, start: int, reserve: list[tuple[int, int]]) -> int:
        """Move the kept spans of a removed region together behind `start`; returns the new end."""
        moves, end = reserve_moves(start, reserve)
        for move in moves:
            for array in (self.k, self.v, self.k_scale, self.v_scale):
                if array is not None:
                    array[:, move.target: move.target + move.length] = \
                        array[:, move.source: move.source + move.length].copy()
        return end


@numba.njit(inline="always", fastmath=True, cache=True, nogil=True)
def _first_key(position, window):
    """The first key position `position` sees: `window` back with a window, else 0."""
    return max(0, position + 1 - window) if window > 0 else 0


_FOUR = np.uint64(4)   # keys per step of the score and value loops


@numba.njit(inline="always", fastmath=True, cache=True, nogil=True)
def _key_scores(query, keys, key_scales, scale, first, stop, row_scores):
    """row_scores[t] = query . keys[t] * scale * key_scales[t] for first <= t < stop; returns their
    maximum. Four keys a step share the loads of the query and the loop's overhead (twice as fast
    as one). The steps start at `first`, so a position's scores do not depend on the other rows."""
    width = np.uint64(query.size)
    best = np.float32(-np.inf)
    t = first
    while t + _FOUR <= stop:
        k0, k1, k2, k3 = keys[t], keys[t + np.uint64(1)], keys[t + np.uint64(2)], keys[t + np.uint64(3)]
        s0 = s1 = s2 = s3 = np.float32(0.0)
        for i in range(width):
            qi = query[i]
            s0 += qi * np.float32(k0[i])
            s1 += qi * np.float32(k1[i])
            s2 += qi * np.float32(k2[i])
            s3 += qi * np.float32(k3[i])
        for j, s in enumerate((s0, s1, s2, s3)):
            u = t + np.uint64(j)
            row_scores[u] = s * (scale * key_scales[u])
            best = max(best, row_scores[u])
        t += _FOUR
    while t < stop:
        s = np.float32(0.0)
        for i in range(width):
            s += query[i] * np.float32(keys[t, i])
        row_scores[t] = s * (scale * key_scales[t])
        best = max(best, row_scores[t])
        t += np.uint64(1)
    return best


@numba.njit(inline="always", fastmath=True, cache=True, nogil=True)
def _weighted_values(weights, values, first, stop, acc):
    """acc = sum over first <= t < stop of weights[t] * values[t], four value rows a step: one
    load and store of acc per four rows (the chain through acc was the loop's bound)."""
    width = np.uint64(acc.size)
    acc[:] = 0.0
    t = first
    while t + _FOUR <= stop:
        t1, t2, t3 = t + np.uint64(1), t + np.uint64(2), t + np.uint64(3)
        p0, p1, p2, p3 = weights[t], weights[t1], weights[t2], weights[t3]
        for i in range(width):
            acc[i] += (p0 * np.float32(values[t, i]) + p1 * np.float32(values[t1, i])
                       + p2 * np.float32(values[t2, i]) + p3 * np.float32(values[t3, i]))
        t += _FOUR
    while t < stop:
        p = weights[t]
        for i in range(width):
            acc[i] += p * np.float32(values[t, i])
        t += np.uint64(1)


@numba.njit(inline="always", fastmath=True, cache=True, nogil=True)
def _softmax_span(row_scores, best, first, stop):
    """row_scores[first:stop] = their softmax, `best` their maximum."""
    norm = np.float32(0.0)
    for t in range(first, stop):
        e = fastmath.exp(row_scores[t] - best)
        row_scores[t] = e
        norm += e
    for t in range(first, stop):
        row_scores[t] = row_scores[t] / norm


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True, **fastmath.VECTOR_DIVISION)
def attend_rows(q, keys, key_scale, values, value_scale, past, window, scale, scores, out):
    """A few query rows (a decode step, a verify block) over the cached keys, heads over the threads.
    q, out [rows, heads, dim]: row r is position past + r and sees keys [_first_key, past + r].
    keys, values [kv_heads, capacity, dim], float32 or int8 codes, each token's row times its
    key_scale / value_scale [kv_heads, capacity] entry; scores [rows, heads, >= past + rows] work
    space. A row's arithmetic does not depend on how many rows there are: a verify row computes
    what its decode step would; the rows read a head's keys and values from cache."""
    rows, heads, dim = q.shape
    group = heads // keys.shape[0]
    for h in numba.prange(heads):
        g = h // group
        head_keys, head_values = keys[g], values[g]
        key_scales, value_scales = key_scale[g], value_scale[g]
        acc = np.empty(dim, dtype=np.float32)
        for r in range(rows):
            first, stop = np.uint64(_first_key(past + r, window)), np.uint64(past + r + 1)
            row_scores = scores[r, h]
            best = _key_scores(q[r, h], head_keys, key_scales, scale, first, stop, row_scores)
            _softmax_span(row_scores, best, first, stop)
            for t in range(first, stop):
                row_scores[t] *= value_scales[t]
            _weighted_values(row_scores, head_values, first, stop, acc)
            out[r, h] = acc


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True, **fastmath.VECTOR_DIVISION)
def attend_rows_float(q, keys, key_scale, values, value_scale, past, window, scale, scores, out):
    """attend_rows for a float32 cache whose head width is a multiple of ROW_CHUNK (the scales
    are ones and not read): the keys' dots and the weighted value rows in vector instructions
    (intrinsics.key_scores, weighted_rows), where numba kept attend_rows' products scalar. 14
    heads over 2 KV heads of width 64, one thread: 29 -> 20 us at 228 keys, 238 -> 180 us at 2001
    (AMD EPYC). As there, a row's arithmetic does not depend on how many rows there are."""
    rows, heads, _ = q.shape
    group = heads // keys.shape[0]
    for h in numba.prange(heads):
        g = h // group
        head_keys, head_values = keys[g], values[g]
        for r in range(rows):
            first, stop = np.uint64(_first_key(past + r, window)), np.uint64(past + r + 1)
            row_scores = scores[r, h]
            best = key_scores(q[r, h], head_keys, first, stop, scale, row_scores)
            _softmax_span(row_scores, best, first, stop)
            weighted_rows(row_scores, head_values, first, stop, out[r, h])


@numba.njit(fastmath=True, cache=True, nogil=True, **fastmath.VECTOR_DIVISION)
def causal_softmax(scores, rows_per_query, first_visible, window):
    """scores [queries*rows_per_query, total] in place; row r sees keys [lo, visible) with
    visible = first_visible + r // rows_per_query and lo = visible - window (0 with no window).
    Unsigned indices into a row view: with signed 2-D indexing the loops did not vectorize (3x slower)."""
    for r in range(scores.shape[0]):
        row = scores[r]
        visible = np.uint64(first_visible + r // rows_per_query)
        lo = np.uint64(max(0, visible - window) if window > 0 else 0)
        for t in range(lo):
            row[t] = 0.0
        best = np.float32(-np.inf)
        for t in range(lo, visible):
            best = max(best, row[t])
        norm = np.float32(0.0)
        for t in range(lo, visible):
            e = fastmath.exp(row[t] - best)
            row[t] = e
            norm += e
        inv = np.float32(1.0) / norm
        for t in range(lo, visible):
            row[t] *= inv
        for t in range(visible, np.uint64(row.size)):
            row[t] = 0.0


@jit.twin_of(attend_rows)
@jit.twin_of(attend_rows_float)
def attend_rows_numpy(q, keys, key_scale, values, value_scale, past, window, scale, scores, out):
    group = q.shape[1] // keys.shape[0]
    for r in range(q.shape[0]):
        span = slice(_first_key.py_func(past + r, window), past + r + 1)
        k = np.repeat(keys[:, span] * key_scale[:, span, None], group, axis=0)      # (heads, keys, dim)
        v = np.repeat(values[:, span] * value_scale[:, span, None], group, axis=0)
        s = np.einsum("hd,htd->ht", q[r], k) * np.float32(scale)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[r] = np.einsum("ht,htd->hd", p, v)


@jit.twin_of(causal_softmax)
def causal_softmax_numpy(scores, rows_per_query, first_visible, window):
    visible = first_visible + np.arange(scores.shape[0]) // rows_per_query
    lo = np.maximum(visible - window, 0) if window > 0 else np.zeros_like(visible)
    keys = np.arange(scores.shape[1])[None, :]
    seen = (keys < visible[:, None]) & (keys >= lo[:, None])
    masked = np.where(seen, scores, -np.inf)
    e = np.exp(masked - masked.max(axis=1, keepdims=True))
    scores[:] = e / e.sum(axis=1, keepdims=True)


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, past: int, scale: float,
           out: np.ndarray, parallel=None, window: int = 0) -> None:
    """q (seq, heads, d); keys/values (kv_heads, >= past+seq, d) -> out (seq, heads, d), causal;
    with a `window`, query p sees only the keys after p - window."""
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
        softmax_args = (scores, group, past + start + 1, window)
        jit.runnable(causal_softmax, softmax_args)(*softmax_args)
        out[start:stop, g * group:(g + 1) * group] = (scores @ values[g, :visible]).reshape(stop - start, group, dim)

    if parallel is None:
        for index in range(len(blocks)):
            block(index)
    else:
        parallel(block, len(blocks))


class CPUAttention(CPUExecution):
    @classmethod
    def variant_for(cls, inputs, node):
        return cls if node.param.kv_cache else CPUEncoderAttention

    def plan(self, inputs, outputs):
        _, self.seq, self.heads, self.dim = inputs[0].shape
        self.kv_heads = inputs[1].shape[2]
        self.scale = np.float32(attention_scale(self.node.param.attnScale, self.dim, self.backend.kv_meta))
        self.window = key_window(inputs[3]) if len(inputs) > 3 else 0

    def bind(self):
        seq, kvh, dim = self.seq, self.kv_heads, self.dim
        self.q = self.value(self.inputs[0]).reshape(seq, self.heads, dim)
        self.k_new = self.value(self.inputs[1]).reshape(seq, kvh, dim).transpose(1, 0, 2)
        self.v_new = self.value(self.inputs[2]).reshape(seq, kvh, dim).transpose(1, 0, 2)
        self.out = self.outputs[0].device.reshape(seq, self.heads, dim)
        self.attend_rows = None
        self.scores = None

    def onExecute(self, inputs, outputs):  # noqa: N802
        for segment in segments(self.backend, self.seq):   # a batched forward: each sequence's rows with its cache
            if segment is None:
                self._attend(0, self.seq)
            else:
                self._attend(segment.start, segment.rows)

    def _attend(self, start: int, rows: int) -> None:
        """Rows [start, start + rows) of q, k and v: one sequence's, into its cache (the backend's now)."""
        cache = self._cache()
        meta = self.backend.kv_meta
        past = meta.previous - meta.remove
        if meta.reserve:
            past = cache.apply_reserve(past, meta.reserve)
        cache.ensure(past + rows)
        span = slice(start, start + rows)
        cache.store(past, self.k_new[:, span], self.v_new[:, span])
        q, out = self.q[span], self.out[span]
        if rows <= ROWS_KERNEL_MAX:
            key_scale, value_scale = cache.scales()
            args = (q, cache.k, key_scale, cache.v, value_scale, past, self.window, self.scale,
                    self._scores(rows, cache.k.shape[1], past), out)
            if self.attend_rows is None:   # the same argument types every step
                vector_rows = not cache.quantized and self.dim % ROW_CHUNK == 0
                self.attend_rows = jit.runnable(attend_rows_float if vector_rows else attend_rows, args)
            self.attend_rows(*args)
        else:
            keys, values = cache.floats(past + rows)
            attend(q, keys, values, past, self.scale, out, self.backend._parallel, self.window)

    def _scores(self, rows: int, capacity: int, past: int) -> np.ndarray:
        """attend_rows' work space for `rows` rows over a cache of `capacity` tokens: kept between
        steps (a new one only as the cache grows), except in a batched forward's segments."""
        scores = self.scores
        if scores is None or scores.shape[0] != rows or scores.shape[2] < past + rows:
            scores = self.backend._scratch("attention_scores", (rows, self.heads, capacity))
            if rows == self.seq:
                self.scores = scores
        return scores

    def _cache(self) -> KVCache:
        return self.backend.kv_cache(self.node.param.layer_index, self.kv_heads, self.dim)


def attend_all(q: np.ndarray, keys: np.ndarray, values: np.ndarray, mask: np.ndarray | None, scale: float) -> np.ndarray:
    """An encoder's attention, every query over every key: q (seq, heads, d), keys/values (seq, kv_heads, d),
    mask (1 or heads, seq, seq) added to the scores, or None -> (seq, heads, d)."""
    group = q.shape[1] // keys.shape[1]
    out = np.empty(q.shape, dtype=np.float32)
    for head in range(q.shape[1]):   # one head's [seq, seq] scores at a time: memory n^2, not heads * n^2
        scores = q[:, head] @ keys[:, head // group].T * np.float32(scale)
        if mask is not None:
            scores += mask[min(head, mask.shape[0] - 1)] if mask.ndim == 3 else mask
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        out[:, head] = scores @ values[:, head // group]
    return out


class CPUEncoderAttention(CPUExecution):
    """An Attention op without a KV cache (kv_cache false: a vision encoder's): the mask input,
    [1, seq, seq] or [1, 1, seq, seq] floats, is added to the scores."""

    def plan(self, inputs, outputs):
        _, self.seq, self.heads, self.dim = inputs[0].shape
        self.scale = np.float32(attention_scale(self.node.param.attnScale, self.dim, self.backend.kv_meta))

    def bind(self):
        seq, dim = self.seq, self.dim
        self.q = self.value(self.inputs[0]).reshape(seq, self.heads, dim)
        self.k = self.value(self.inputs[1]).reshape(seq, -1, dim)
        self.v = self.value(self.inputs[2]).reshape(seq, -1, dim)
        self.mask = self.value(self.inputs[3]).reshape(-1, seq, seq) if len(self.inputs) > 3 else None
        self.out = self.outputs[0].device.reshape(seq, self.heads, dim)

    def onExecute(self, inputs, outputs):  # noqa: N802
        self.out[:] = attend_all(self.q, self.k, self.v, self.mask, self.scale)


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"Attention": CPUAttention}
