"""MNN's fused Attention op on the CPU, with the KV cache kept inside the backend.

Inputs: q (1, seq, heads, head_dim), k (1, seq, kv_heads, head_dim), v (same values, any
layout with seq first), mask. The mask input is not read: like MNN's CPU kernel, the op masks
causally itself, from how many tokens the cache already holds (KVMeta).
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend import Execution


class KVCache:
    """One layer's keys and values: (kv_heads, capacity, head_dim) float32, grown by doubling."""

    def __init__(self, kv_heads: int, head_dim: int, capacity: int = 256):
        self.k = np.zeros((kv_heads, capacity, head_dim), dtype=np.float32)
        self.v = np.zeros_like(self.k)

    def ensure(self, length: int) -> None:
        capacity = self.k.shape[1]
        if length <= capacity:
            return
        while capacity < length:
            capacity *= 2
        for name in ("k", "v"):
            old = getattr(self, name)
            grown = np.zeros((old.shape[0], capacity, old.shape[2]), dtype=np.float32)
            grown[:, : old.shape[1]] = old
            setattr(self, name, grown)

    def apply_reserve(self, start: int, reserve: list[tuple[int, int]]) -> int:
        """Move the kept spans of a removed region together behind `start`; returns the new end."""
        for begin, length in reserve:
            src = slice(start + begin, start + begin + length)
            dst = slice(start, start + length)
            self.k[:, dst] = self.k[:, src].copy()
            self.v[:, dst] = self.v[:, src].copy()
            start += length
        return start


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, past: int, scale: float) -> np.ndarray:
    """q (seq, heads, d); keys/values (kv_heads, past+seq, d) -> (seq, heads, d), causal."""
    seq, heads, dim = q.shape
    kv_heads, total, _ = keys.shape
    group = heads // kv_heads
    qg = q.transpose(1, 0, 2).reshape(kv_heads, group * seq, dim)          # (kvh, group*seq, d)
    scores = np.matmul(qg, keys.transpose(0, 2, 1)) * np.float32(scale)    # (kvh, group*seq, total)
    scores = scores.reshape(kv_heads, group, seq, total)
    visible = np.arange(total)[None, :] <= (past + np.arange(seq))[:, None]
    scores = np.where(visible, scores, np.float32(-np.inf))
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.matmul(probs.reshape(kv_heads, group * seq, total), values)   # (kvh, group*seq, d)
    return out.reshape(heads, seq, dim).transpose(1, 0, 2)


class CPUAttention(Execution):
    def onExecute(self, inputs, outputs):  # noqa: N802
        q, k = inputs[0].device, inputs[1].device
        _, seq, heads, dim = q.shape
        kv_heads = k.shape[2]
        k_new = k.reshape(seq, kv_heads, dim).transpose(1, 0, 2)
        v_new = np.asarray(inputs[2].device).reshape(seq, kv_heads, dim).transpose(1, 0, 2)
        cache = self._cache(kv_heads, dim)
        meta = self.backend.kv_meta
        past = cache.apply_reserve(meta.previous - meta.remove, meta.reserve)
        cache.ensure(past + seq)
        cache.k[:, past: past + seq] = k_new
        cache.v[:, past: past + seq] = v_new
        scale = self.node.param.attnScale or 1.0 / np.sqrt(dim)
        out = attend(q.reshape(seq, heads, dim), cache.k[:, : past + seq], cache.v[:, : past + seq], past, scale)
        outputs[0].device = np.ascontiguousarray(out, dtype=np.float32).reshape(outputs[0].shape)

    def _cache(self, kv_heads: int, dim: int) -> KVCache:
        layer = self.node.param.layer_index
        caches = self.backend.kv_caches
        if layer not in caches:
            caches[layer] = KVCache(kv_heads, dim)
        return caches[layer]
