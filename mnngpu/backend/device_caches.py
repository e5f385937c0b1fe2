"""What a device backend's caches share: KV pools with a slot per sequence (PooledKVCaches, for
backends whose recorded commands bind one pool per layer) and the recurrent state in device
buffers with what rolls a verify forward back (DeviceStateCache)."""

from __future__ import annotations

import weakref

import numpy as np

from mnngpu.backend.interface import Backend
from mnngpu.backend.kv import check_state_parts
from mnngpu.errors import ModelFormatError


class Slot:
    """A sequence's region in every layer's KV pool; the index goes back to `free` once no cache of
    the sequence holds it any more (the sequence was dropped)."""

    def __init__(self, index: int, free: list[int]):
        self.index = index
        weakref.finalize(self, free.append, index)


class PooledKVCaches:
    """What a backend whose layers keep every sequence's keys and values in one pool each (Vulkan,
    CUDA: recorded commands bind the pool, a region a sequence) shares: a sequence's caches are its
    slot's region of every pool, a new sequence takes the lowest free slot, and every pool grows
    where all are taken. The backend has `kv_caches` (the current sequence's, by layer), `slots`,
    `_kv_pool(layer, kv_heads, head_dim)`, `_grow_slots(needed)` and `pooled_cache(pool, slot)`."""

    def _start_slots(self) -> None:
        self.slots = 1   # sequences each pool has room for
        self._slots_taken = 0
        self._free_slots: list[int] = []

    def kv_cache(self, layer: int, kv_heads: int, head_dim: int):
        """The current sequence's cache of `layer`: its slot's region of the layer's pool."""
        cache = self.kv_caches.get(layer)
        if cache is None:
            pool = self._kv_pool(layer, kv_heads, head_dim)
            slot = next((c.slot for c in self.kv_caches.values()), None) or self._take_slot()
            cache = self.kv_caches[layer] = self.pooled_cache(pool, slot)
        elif (cache.kv_heads, cache.head_dim) != (kv_heads, head_dim):
            raise ModelFormatError(f"layer {layer}'s Attention ops disagree on kv heads / head dim",
                                   field="Attention.layer_index")
        return cache

    def _take_slot(self) -> Slot:
        """A free slot for a sequence's caches, the pools grown where every slot is taken."""
        if self._free_slots:
            index = min(self._free_slots)
            self._free_slots.remove(index)
        else:
            index = self._slots_taken
            if index >= self.slots:
                self._grow_slots(index + 1)
            self._slots_taken += 1
        return Slot(index, self._free_slots)


class DeviceStateCache:
    """What a device backend's StateCache shares (backends/<name>/state.py): the float32 parts in
    device buffers, and what takes a verify forward back: the parts as they were before it
    (`before`) and its real input rows, which the kernels copy into `saved` (qkv, and gate and beta
    for the gated delta rule). A subclass makes, sizes, fills and copies its device's buffers."""

    def __init__(self, backend: Backend, shapes: dict[str, tuple[int, ...]]):
        self.backend = backend
        self._shapes = {name: tuple(shape) for name, shape in shapes.items()}
        self.parts = {name: self._new(shape) for name, shape in self._shapes.items()}
        self.before: dict = {}
        self.saved: dict = {}      # "qkv", and "gate", "beta" for the gated delta rule
        self.saved_rows = 0        # rows `saved` has room for
        self.undo_rows = 0         # real rows of the last forward, where it was a verify

    @classmethod
    def adopt(cls, backend: Backend, name: str, shapes: dict[str, tuple[int, ...]]):
        """The device state of op `name`: made zero where absent; where the prefix cache wrote host
        parts before the op first ran (write_states), those parts moved onto the device."""
        state = backend.state_caches.get(name)
        if isinstance(state, cls):
            return state
        device = cls(backend, shapes)
        if state is None:
            device.reset()
        else:
            device.write(state.read())
        backend.state_caches[name] = device
        return device

    # ---- what a device does ------------------------------------------------------------------------
    def _new(self, shape: tuple[int, ...]):
        """A float32 buffer of `shape`."""
        raise NotImplementedError

    def _new_rows(self, rows: int, width: int):
        """A buffer of `rows` saved input rows of `width` values."""
        raise NotImplementedError

    def _buffer_bytes(self, buffer) -> int:
        raise NotImplementedError

    def _write(self, parts: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def _zero(self) -> None:
        raise NotImplementedError

    def _copy(self, source: dict, target: dict) -> None:
        """Each part's buffer in `source` copied into its buffer in `target`."""
        raise NotImplementedError

    # ---- the StateCache protocol (read is the device's) ----------------------------------------------
    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    @property
    def nbytes(self) -> int:
        return sum(map(self._buffer_bytes, (*self.parts.values(), *self.before.values(), *self.saved.values())))

    @property
    def undoable(self) -> int:
        return self.undo_rows

    def write(self, parts: dict[str, np.ndarray]) -> None:
        check_state_parts(self._shapes, parts)
        self._write(parts)
        self.forget()

    def reset(self) -> None:
        self._zero()
        self.forget()

    # ---- taking a verify forward back -----------------------------------------------------------------
    def room_for_rows(self, rows: int, widths: dict[str, int]) -> None:
        """Make `saved` hold `rows` rows of each input (width: values per row); the before-parts too."""
        if rows <= self.saved_rows:
            return
        self.saved = {name: self._new_rows(rows, width) for name, width in widths.items()}
        self.saved_rows = rows
        self.before = {name: self._new(shape) for name, shape in self._shapes.items()}

    def remember(self, rows: int) -> None:
        """The coming forward is a verify block of `rows` real rows: keep the parts as they are now
        (its kernels save the rows themselves)."""
        self._copy(self.parts, self.before)
        self.undo_rows = rows

    def restore(self) -> None:
        """The parts as they were before the last verify forward."""
        self._copy(self.before, self.parts)
        self.forget()

    def forget(self) -> None:
        self.undo_rows = 0
