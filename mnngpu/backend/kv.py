"""The KV cache: KVMeta, the KVCache protocol every backend's caches follow, the StateCache protocol of
a recurrent layer's state beside it, and what they share.

KVMeta is what the next forward does to every layer's KV cache, shared by all Attention ops.

MNN's semantics: before a forward, `remove` tokens are dropped from the end of the cache,
`reserve` lists (begin, length) pairs of the removed span to keep, and `add` new tokens are
appended. `sync()` after the forward makes `previous` the cache's new length.

Like MNN's, it also carries the config's `attn_scale` to every Attention op.

A recurrent layer (LinearAttention, mnngpu/ops/linear_attention.py) keeps a state instead of keys
and values: the state after the `previous` tokens. KVMeta drives it too (`state_step`): a forward
that keeps no token (the first after `reset()`, which clears the cache) starts from zero state, a
chunked prefill carries it from chunk to chunk, and a `remove` of some rows of the last forward
rolls it back, where that forward was marked `verify` (a speculative verify block, whose rejected
rows the next forward removes): the layer kept its state from before the block and the block's
inputs, and runs the accepted rows again. Any other drop of tokens behind the state (a `remove`
reaching further back, a `reserve`) is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from mnngpu.errors import MnnGpuError

# layer index -> (keys, values), each float32 (kv_heads, length, head_dim)
Layers = dict[int, tuple[np.ndarray, np.ndarray]]
# recurrent op name -> its state's parts (StateCache.read)
States = dict[str, dict[str, np.ndarray]]


@dataclass(frozen=True)
class CacheLayout:
    """What a model's caches hold for a sequence (runtime.validate.cache_layout reads it off the
    graph): the KV cache's layers, by Attention layer_index, and each recurrent layer's state
    shapes, by LinearAttention op name (StateCache.shapes)."""

    kv_layers: tuple[int, ...]
    states: dict[str, dict[str, tuple[int, ...]]]


@dataclass
class KVMeta:
    previous: int = 0
    remove: int = 0
    add: int = 0
    reserve: list[tuple[int, int]] = field(default_factory=list)
    attn_scale: float = 0.0  # llm_config's attn_scale; 0: none recorded
    # this forward is a verify block: the next forward may `remove` some of its rows again, so a
    # recurrent layer keeps what rolls its state back to any of them
    verify: bool = False

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
        self.verify = False

    def clear(self) -> None:
        """Drop the whole cache on the next forward."""
        self.remove = self.previous
        self.reserve = []


@runtime_checkable
class KVCache(Protocol):
    """One Attention layer's cache on one backend (Backend.kv_cache makes it, `kv_caches` holds it).

    Shapes: a backend stores keys and values as (kv_heads, capacity, head_dim) each, in its own
    storage (float, or int8 codes beside a float32 scale per head and token); across this
    interface they are float32 (kv_heads, length, head_dim), token 0 first. How many tokens are
    valid is KVMeta's, not the cache's: `read` and `write` take the length.

    A cache holds one sequence; several sequences each have their own (Sequence, below), and a
    batched forward's Segments say which rows are whose. A recurrent layer's state is the sibling
    protocol, StateCache.
    """

    kv_heads: int
    head_dim: int

    @property
    def capacity(self) -> int:
        """Tokens the cache holds room for now."""

    @property
    def nbytes(self) -> int:
        """Bytes of storage the cache holds (keys, values and their scales)."""

    def read(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the first `length` keys and values, float32 (kv_heads, length, head_dim) each."""

    def write(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Hold exactly these keys and values (kv_heads, length, head_dim), coded as this cache codes them."""

    def apply_reserve(self, start: int, reserve: list[tuple[int, int]]) -> int:
        """Move the kept (begin, length) spans of a removed region together behind `start`; the new end."""

    def reset(self) -> None:
        """Clear everything the cache holds (every value zero), keeping its capacity."""


@runtime_checkable
class StateCache(Protocol):
    """One recurrent layer's state on one backend (a LinearAttention op's), the sibling of KVCache:
    kept in the backend's `state_caches` under the op's name, made by the backend's executions.

    The state is a few named float32 arrays of fixed shapes (ops.linear_attention.state_shapes):
    "conv", the causal convolution's last inputs (channels, kernel - 1), and for the gated delta
    rule "recurrent" (v heads, head_k_dim, head_v_dim). It holds what the tokens KVMeta counts as
    `previous` left behind; `state_step` says when it starts from zero, and how far back a `remove`
    may roll it (`undoable`: the rows of the last forward, when KVMeta marked it `verify`)."""

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each part's shape."""

    @property
    def nbytes(self) -> int:
        """Bytes of storage the state holds."""

    def read(self) -> dict[str, np.ndarray]:
        """float32 copies of every part."""

    def write(self, parts: dict[str, np.ndarray]) -> None:
        """Hold exactly these parts (the shapes of `shapes`)."""

    @property
    def undoable(self) -> int:
        """How many rows of the last forward a `remove` may take back (0: none)."""

    def reset(self) -> None:
        """Zero every part: the state before any token (nothing left to take back)."""


class HostStateCache:
    """A StateCache of float32 host arrays: the CPU backend's (a device backend's LinearAttention
    runs on its CPU backup), and what the prefix cache fills (`write_states`). It also keeps what
    takes the last verify forward back (the CPU kernel's rollback): the state before it
    (`before`) and its real input rows (`rows`: qkv (channels, n), and for the gated delta rule
    gate and beta (n, v heads))."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        self.parts = {name: np.zeros(shape, dtype=np.float32) for name, shape in shapes.items()}
        self.before: dict[str, np.ndarray] = {}
        self.rows: tuple[np.ndarray, ...] = ()

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: part.shape for name, part in self.parts.items()}

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in (*self.parts.values(), *self.before.values(), *self.rows))

    @property
    def undoable(self) -> int:
        return self.rows[0].shape[1] if self.rows else 0

    def remember(self, rows: tuple[np.ndarray, ...]) -> None:
        """Keep the state as it is now, and copies of the input rows the coming forward takes in."""
        self.before = self.read()
        self.rows = tuple(np.array(part, dtype=np.float32) for part in rows)

    def forget(self) -> None:
        """Drop what would take the last forward back."""
        self.before, self.rows = {}, ()

    def read(self) -> dict[str, np.ndarray]:
        return {name: part.copy() for name, part in self.parts.items()}

    def write(self, parts: dict[str, np.ndarray]) -> None:
        check_state_parts(self.shapes, parts)
        for name, part in parts.items():
            self.parts[name][...] = part
        self.forget()

    def reset(self) -> None:
        for part in self.parts.values():
            part[...] = 0.0
        self.forget()


def check_state_parts(shapes: dict[str, tuple[int, ...]], parts: dict[str, np.ndarray]) -> None:
    """A StateCache.write's check: exactly the parts of `shapes`, each of its shape."""
    got = {name: np.shape(part) for name, part in parts.items()}
    if got != shapes:
        raise ValueError(f"a state of {shapes}, got {got}")


class Sequence:
    """One sequence's caches: its KVMeta, and on each backend that holds any for it, its KV caches by
    layer and its recurrent states by op name. A backend runs one sequence at a time, the one
    `RuntimeManager.use_sequence` (or, inside a batched forward, `Backend.segments`) put in its
    `kv_meta`, `kv_caches` and `state_caches`; the rest wait here with what they hold."""

    def __init__(self, meta: KVMeta | None = None):
        self.meta = meta if meta is not None else KVMeta()
        self.caches: dict[int, tuple[dict, dict]] = {}   # id(backend) -> (kv_caches, state_caches)
        self.context = None   # what the engine keeps for the sequence beside its caches (Llm.use_sequence)

    def caches_on(self, backend: object) -> tuple[dict, dict]:
        """This sequence's (kv_caches, state_caches) on `backend`, made empty when absent."""
        return self.caches.setdefault(id(backend), ({}, {}))

    def nbytes(self) -> int:
        return sum(cache.nbytes for kv, states in self.caches.values() for cache in (*kv.values(), *states.values()))


@dataclass
class Segment:
    """Rows [start, start + rows) of a forward that belong to `sequence` (a batched forward runs
    several sequences' rows together; each segment's Attention and recurrent rows read and write
    only its own caches)."""

    sequence: Sequence
    start: int
    rows: int


class StateRollbackError(MnnGpuError):
    """A forward would drop tokens that a recurrent layer's state has already taken in."""


def state_step(meta: KVMeta | None, layer: str, undoable: int = 0) -> bool:
    """Whether the next forward continues a recurrent layer's state (False: it starts from zero,
    the cache keeping no token); when it does, the state first takes back KVMeta's `remove` rows.
    `undoable`: how many rows of the last forward the layer can take back (StateCache.undoable).
    Raises StateRollbackError for a forward that keeps some tokens but drops more than that, or
    moves a reserve: the state has taken them in and cannot be rolled back that far."""
    if meta is None or meta.kept == 0:
        return False
    if meta.reserve:
        raise StateRollbackError(f"this forward keeps reserved spans of removed tokens, but layer {layer} keeps "
                                 "a recurrent state that has taken all of them in and cannot be rolled back",
                                 field="kv_meta.reserve")
    if meta.remove > undoable:
        raise StateRollbackError(f"this forward drops {meta.remove} cached tokens, but layer {layer} keeps a "
                                 "recurrent state that has taken them in and cannot be rolled back further than "
                                 f"the rows of the last verify forward ({undoable})", field="kv_meta.remove")
    return True


def begin_state_forward(state: StateCache, meta: KVMeta | None, layer: str, rows: int,
                        take_back: Callable[[int], None]) -> tuple[int, bool]:
    """What a recurrent layer does before a forward of `rows` rows: start its state over, or first
    `take_back` the rows KVMeta removes (state_step). Returns the real rows (KVMeta's `add` of
    them) and whether the forward is a verify block, whose rows the layer keeps to roll it back."""
    if not state_step(meta, layer, state.undoable):
        state.reset()
    elif meta.remove:
        take_back(meta.remove)
    real = min(meta.add, rows) if meta is not None else rows
    return real, meta is not None and meta.verify


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


def requantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_int8 of rows that may be an int8 cache's own codes times its scales (what a cache's
    read() gives the prefix cache): max|x| / 127 can miss the scale those rows came from by a unit
    in the last place, so each row takes the neighbouring float32 scale that decodes it exactly
    where there is one, and writing back what was read stores the same codes and scales."""
    x = np.asarray(x, dtype=np.float32)
    codes, scale = quantize_int8(x)
    exact = _decodes(codes, scale, x)
    for candidate in (np.nextafter(scale, np.float32(0)), np.nextafter(scale, np.float32(np.inf))):
        inverse = np.divide(np.float32(1.0), candidate, out=np.zeros_like(candidate), where=candidate > 0)
        trial = np.clip(np.rint(x * inverse[..., None]), -127, 127).astype(np.int8)
        better = ~exact & _decodes(trial, candidate, x)
        codes[better], scale[better], exact = trial[better], candidate[better], exact | better
    return codes, scale


def _decodes(codes: np.ndarray, scale: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per row: whether codes times scale (float32) are exactly x."""
    return np.all(codes.astype(np.float32) * scale[..., None] == x, axis=-1)


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (..., head_dim) -> int8 codes and float32 scales (...): the int8 KV cache's coding
    (attention_mode 1, 2). One symmetric scale per row, s = max|x| / 127, codes rint(x * (1/s)),
    all in float32: the device kernels' arithmetic, so every backend stores the same codes."""
    x = np.asarray(x, dtype=np.float32)
    scale = np.abs(x).max(axis=-1) / np.float32(127.0)
    inverse = np.divide(np.float32(1.0), scale, out=np.zeros_like(scale), where=scale > 0)
    codes = np.clip(np.rint(x * inverse[..., None]), -127, 127).astype(np.int8)
    return codes, scale
