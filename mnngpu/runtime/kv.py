"""KVMeta: what the next forward does to every layer's KV cache, shared by all Attention ops.

MNN's semantics: before a forward, `remove` tokens are dropped from the end of the cache,
`reserve` lists (begin, length) pairs of the removed span to keep, and `add` new tokens are
appended. `sync()` after the forward makes `previous` the cache's new length.

Like MNN's, it also carries the config's `attn_scale` to every Attention op.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class KVMeta:
    previous: int = 0
    remove: int = 0
    add: int = 0
    reserve: list[tuple[int, int]] = field(default_factory=list)
    attn_scale: float = 0.0  # llm_config's attn_scale; 0: none recorded

    @property
    def n_reserve(self) -> int:
        return len(self.reserve)

    @property
    def kept(self) -> int:
        """Tokens that stay in front of the new ones during this forward."""
        return self.previous - self.remove + sum(length for _, length in self.reserve)

    def sync(self) -> None:
        self.previous = self.kept + self.add
        self.remove = 0
        self.add = 0
        self.reserve = []

    def clear(self) -> None:
        """Drop the whole cache on the next forward."""
        self.remove = self.previous
        self.reserve = []


@dataclass
class SpanMove:
    """Token rows [source, source + length) of every head move to [target, target + length)."""

    source: int
    target: int
    length: int


def reserve_moves(start: int, reserve: list[tuple[int, int]]) -> tuple[list[SpanMove], int]:
    """The moves that gather the kept (begin, length) spans of a removed region behind `start`,
    in order (a span may overlap its target: copy through a scratch buffer, or copy a snapshot),
    and the cache's new end. Spans already in place need no move."""
    moves = []
    for begin, length in reserve:
        if begin != 0 and length > 0:
            moves.append(SpanMove(start + begin, start, length))
        start += length
    return moves, start


def grown_capacity(capacity: int, needed: int, multiple: int = 1) -> int:
    """A cache's capacity once it must hold `needed` tokens: grown by at least half (so appends stay
    amortized), rounded up to `multiple`. Device caches are sized up front; this is their safety net."""
    if needed <= capacity:
        return capacity
    return -(-max(needed, capacity + capacity // 2) // multiple) * multiple


def attention_scale(op_scale: float, head_dim: int, meta: KVMeta | None) -> float:
    """The Attention op's own scale; where the op records none (0), the config's attn_scale;
    where neither does, 1/sqrt(head_dim)."""
    if op_scale:
        return float(op_scale)
    if meta is not None and meta.attn_scale > 0:
        return float(meta.attn_scale)
    return float(1.0 / np.sqrt(head_dim))


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (..., head_dim) -> int8 codes and float32 scales (...): the int8 KV cache's coding
    (attention_mode 1, 2). One symmetric scale per row, s = max|x| / 127, codes rint(x * (1/s)),
    all in float32: the device kernels' arithmetic, so every backend stores the same codes."""
    x = np.asarray(x, dtype=np.float32)
    scale = np.abs(x).max(axis=-1) / np.float32(127.0)
    inverse = np.divide(np.float32(1.0), scale, out=np.zeros_like(scale), where=scale > 0)
    codes = np.clip(np.rint(x * inverse[..., None]), -127, 127).astype(np.int8)
    return codes, scale
