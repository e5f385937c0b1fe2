"""MNN's fused Attention on the device, each layer's KV cache kept on the device.

Several sequences (continuous batching) as on Vulkan: each layer's keys and values are one array
per side with a region per sequence (KVPool: [slot][kv_heads][capacity][head_dim]), so the launches
prepared once, and the CUDA graph holding them, serve every sequence. The kernels find a row's
region and position in device memory written before each step: the backend's step buffer (kept
length, slot) for a forward of one sequence, or its rows table (slot, position per row) for a
batched forward (rows of several sequences), where rows no sequence holds are idle (IDLE_SLOT):
they store nothing and attend to nothing. A sequence takes a slot at its first forward and gives it
back when dropped (Slot); more sequences than slots, or more tokens than the capacity, grow every
pool before the run's first launch (CUDABackend._prepare_run), and the launches are prepared again
over the new arrays.

Inputs: q (1, seq, heads, head_dim), k (1, seq, kv_heads, head_dim), v (the same values seq-major,
any shape), mask (the kernel masks causally, like MNN's; the mask only names a key window, for a
sliding layer: runtime.attention_mask).
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend.device_caches import Slot
from mnngpu.backend.kv import attention_scale, grown_capacity, reserve_moves
from mnngpu.backend.sequences import segments
from mnngpu.backends.cuda.device import BLOCK, grid_for
from mnngpu.backends.cuda.ops.base import CUDAExecution
from mnngpu.errors import ConfigError, InputError, MnnGpuError
from mnngpu.ops.attention import key_window

ATT_TILE = 128                # threads per block of the attention kernel (attention.cu)
MAX_HEAD_DIM = 2 * ATT_TILE
IDLE_SLOT = -1                # a rows-table slot: the row is no sequence's (attention.cu)


class KVPool:
    """One layer's keys and values for every sequence the backend runs: storage dtype
    [slots, kv_heads, capacity, head_dim] per side. The prepared launches bind these arrays;
    growing (more slots, or more tokens per slot) replaces them and bumps `version`, so the
    launches are prepared again and the backend's CUDA graphs captured again."""

    def __init__(self, device, storage, kv_heads: int, head_dim: int, capacity: int, slots: int):
        self.device, self.storage = device, storage
        self.kv_heads, self.head_dim, self.capacity, self.slots = kv_heads, head_dim, capacity, slots
        self.k = self._zeros(slots, capacity)
        self.v = self._zeros(slots, capacity)
        self.version = 0

    def _zeros(self, slots: int, capacity: int):
        with self.device.stream:
            return self.device.cp.zeros((slots, self.kv_heads, capacity, self.head_dim), dtype=self.storage.dtype)

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot's keys and values."""
        return 2 * self.kv_heads * self.capacity * self.head_dim * self.storage.itemsize

    def grow(self, slots: int | None = None, tokens: int = 0) -> bool:
        """Room for `slots` sequences of `tokens` tokens each (backend.kv.grown_capacity), the
        present regions kept; True when the arrays were replaced."""
        slots = max(slots or self.slots, self.slots)
        capacity = grown_capacity(self.capacity, tokens)
        if (slots, capacity) == (self.slots, self.capacity):
            return False
        grown = []
        for old in (self.k, self.v):
            new = self._zeros(slots, capacity)
            with self.device.stream:
                new[: self.slots, :, : self.capacity] = old
            grown.append(new)
        self.k, self.v = grown
        self.slots, self.capacity = slots, capacity
        self.version += 1
        return True


class DeviceKVCache:
    """One layer's cache of one sequence (a backend.kv.KVCache): its slot's region of the layer's
    KVPool, storage dtype [kv_heads, capacity, head_dim] per side."""

    def __init__(self, pool: KVPool, slot: Slot):
        self.pool, self.slot = pool, slot
        self.device, self.storage = pool.device, pool.storage
        self.kv_heads, self.head_dim = pool.kv_heads, pool.head_dim

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    @property
    def k(self):
        """This sequence's keys: a view of the pool's array (replaced when the pool grows)."""
        return self.pool.k[self.slot.index]

    @property
    def v(self):
        return self.pool.v[self.slot.index]

    @property
    def nbytes(self) -> int:
        return self.pool.slot_bytes

    def reset(self) -> None:
        with self.device.stream:
            self.k.fill(0)
            self.v.fill(0)

    def read(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        with self.device.stream:
            sides = [side[:, :length].get(stream=self.device.stream) for side in (self.k, self.v)]
        self.device.synchronize()
        keys, values = (np.asarray(self.storage.from_storage(side), dtype=np.float32) for side in sides)
        return keys, values

    def write(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Kept within the capacity: a grown pool would leave a captured CUDA graph on the old arrays."""
        length = keys.shape[1]
        if length > self.capacity:
            raise InputError(f"{length} stored tokens exceed the CUDA KV cache of {self.capacity}",
                             field="max_all_tokens")
        for side, array in ((self.k, keys), (self.v, values)):
            stored = self.storage.to_storage(np.asarray(array, dtype=np.float32).reshape(-1))
            rows = self.device.to_device(stored.reshape(array.shape))
            with self.device.stream:
                side[:, :length] = rows
        self.device.synchronize()

    def apply_reserve(self, start: int, reserve: list[tuple[int, int]]) -> int:
        """Move the kept (begin, length) spans of a removed region together behind `start`;
        returns the new end (as the CPU backend's KVCache.apply_reserve)."""
        moves, end = reserve_moves(start, reserve)
        with self.device.stream:
            for move in moves:
                for cache in (self.k, self.v):
                    cache[:, move.target: move.target + move.length] = \
                        cache[:, move.source: move.source + move.length].copy()
        return end


class CUDAAttention(CUDAExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        if not node.param.kv_cache:   # an encoder's (embedding models): every query over every key, the mask added
            return "no attention kernel without a KV cache"
        return None if supported(inputs) else "no attention kernel for this head layout"

    def onResize(self, inputs, outputs):
        backend = self.backend
        _, self.seq, self.heads, self.head_dim = inputs[0].shape
        self.kv_heads = inputs[1].shape[2]
        self.pool = backend._kv_pool(self.node.param.layer_index, self.kv_heads, self.head_dim)
        # a batched decode module (resized inside a batched forward) places each row by the rows table
        self.batched = backend.batch is not None
        if self.batched and self.seq > backend.rows_table_rows:
            raise ConfigError(f"a batched forward of {self.seq} rows: the CUDA backend places at most "
                              f"{backend.rows_table_rows}; use fewer --parallel slots", field="parallel")
        self.buffers = [backend._buffer(t) for t in (inputs[0], inputs[1], inputs[2], outputs[0])]
        self.window = np.int32(key_window(inputs[3]) if len(inputs) > 3 else 0)
        self._prepare()

    def _prepare(self) -> None:
        self.launches = []
        backend, pool = self.backend, self.pool
        q, k, v, out = self.buffers
        seq, heads, kv_heads, dim = (np.int32(x) for x in (self.seq, self.heads, self.kv_heads, self.head_dim))
        capacity = np.int32(pool.capacity)
        places = (np.int32(self.batched), backend.step, backend.rows_table)
        scale = np.float32(attention_scale(self.node.param.attnScale, self.head_dim, self.backend.kv_meta))
        n = self.seq * self.kv_heads * self.head_dim
        self.prepare("attention.cu", "kv_append", grid_for(n), (BLOCK,),
                     (seq, kv_heads, dim, capacity, *places, k, v, pool.k, pool.v))
        self.prepare("attention.cu", "attention", (self.heads, self.seq), (ATT_TILE,),
                     (seq, heads, kv_heads, dim, capacity, scale, self.window, *places, q, pool.k, pool.v, out))
        self.bound_version = pool.version

    # ---- each step, on the host ------------------------------------------------------------------
    def before_launch(self) -> None:
        backend = self.backend
        if self.recording is None:   # launched outside any resize's recording: no _prepare_run
            backend._make_room([self])
        if self.batched:
            backend._set_rows(self._places())
        elif backend.batch is not None:
            raise MnnGpuError("a CUDA module prepared for one sequence ran a batched forward")
        else:
            cache = self.cache()
            backend._set_step(self._past(cache, self.seq), cache.slot.index)

    def cache(self) -> DeviceKVCache:
        """The current sequence's cache of this layer (its slot taken at its first forward)."""
        return self.backend.kv_cache(self.node.param.layer_index, self.kv_heads, self.head_dim)

    def _past(self, cache: DeviceKVCache, rows: int) -> int:
        """Apply the current sequence's KVMeta (a reserve's moves); the kept length the new rows follow."""
        meta = self.backend.kv_meta
        past = cache.apply_reserve(meta.previous - meta.remove, meta.reserve)
        if past + rows > cache.capacity:
            raise MnnGpuError(f"{past} cached + {rows} new tokens exceed the CUDA KV cache of {cache.capacity}, "
                              "which should have grown before the run")
        return past

    def _places(self) -> np.ndarray:
        """Each row's (slot, position) for the rows table; idle rows (no sequence's) IDLE_SLOT."""
        places = np.full((self.seq, 2), IDLE_SLOT, dtype=np.int32)
        for segment in segments(self.backend, self.seq):
            start, rows = (0, self.seq) if segment is None else (segment.start, segment.rows)
            cache = self.cache()
            places[start: start + rows, 0] = cache.slot.index
            places[start: start + rows, 1] = self._past(cache, rows) + np.arange(rows)
        return places

    def launch(self) -> None:
        if self.bound_version != self.pool.version:
            self._prepare()
        super().launch()


def supported(inputs) -> bool:
    q, k = inputs[0].shape, inputs[1].shape
    return len(q) == 4 and len(k) == 4 and q[3] <= MAX_HEAD_DIM and k[2] > 0 and q[2] % k[2] == 0


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"Attention": CUDAAttention}
