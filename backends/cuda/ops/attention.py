"""MNN's fused Attention on the device, each layer's KV cache kept on the device.

The launches are prepared once per module and read the number of cached tokens from a
one-int device buffer (CUDABackend.set_kv_length) that is written before each step, so the
same launches, or the CUDA graph holding them, serve every step. Inputs: q (1, seq, heads,
head_dim), k (1, seq, kv_heads, head_dim), v (the same values seq-major, any shape), mask (the
kernel masks causally, like MNN's; the mask only names a key window, for a sliding layer:
runtime.attention_mask).
"""

from __future__ import annotations

import numpy as np

from mnngpu.backends.cuda.device import BLOCK, grid_for
from mnngpu.backends.cuda.memory import Storage
from mnngpu.backends.cuda.ops.base import CudaExecution
from mnngpu.errors import InputError
from mnngpu.runtime.attention_mask import key_window
from mnngpu.runtime.kv import attention_scale, grown_capacity, reserve_moves

ATT_TILE = 128                # threads per block of the attention kernel (attention.cu)
MAX_HEAD_DIM = 2 * ATT_TILE


class DeviceKVCache:
    """One layer's keys and values (a runtime.kv.KVCache): storage dtype [kv_heads, capacity,
    head_dim] each."""

    def __init__(self, device, storage: Storage, kv_heads: int, head_dim: int, capacity: int):
        self.device, self.storage, self.dtype = device, storage, storage.dtype
        self.kv_heads, self.head_dim, self.capacity = kv_heads, head_dim, capacity
        self.k = self._zeros(capacity)
        self.v = self._zeros(capacity)
        self.version = 0  # bumped when the arrays are replaced, so launches are prepared again

    def _zeros(self, capacity: int):
        with self.device.stream:
            return self.device.cp.zeros((self.kv_heads, capacity, self.head_dim), dtype=self.dtype)

    def ensure(self, length: int) -> bool:
        """Room for `length` tokens; True when the arrays were replaced (runtime.kv.grown_capacity)."""
        capacity = grown_capacity(self.capacity, length)
        if capacity == self.capacity:
            return False
        grown = []
        for old in (self.k, self.v):
            new = self._zeros(capacity)
            with self.device.stream:
                new[:, : self.capacity] = old
            grown.append(new)
        self.k, self.v = grown
        self.capacity = capacity
        self.version += 1
        return True

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)

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
        """Kept within the capacity: a grown cache would leave a captured CUDA graph on the old arrays."""
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


class AttentionExecution(CudaExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        return None if supported(inputs) else "no attention kernel for this head layout"

    def onResize(self, inputs, outputs):
        _, self.seq, self.heads, self.head_dim = inputs[0].shape
        self.kv_heads = inputs[1].shape[2]
        self.cache = self.backend.kv_cache(self.node.param.layer_index, self.kv_heads, self.head_dim)
        self.buffers = [self.backend._buffer(t) for t in (inputs[0], inputs[1], inputs[2], outputs[0])]
        self.window = np.int32(key_window(inputs[3]) if len(inputs) > 3 else 0)
        self._prepare()

    def _prepare(self) -> None:
        self.launches = []
        backend, cache = self.backend, self.cache
        q, k, v, out = self.buffers
        seq, heads, kv_heads, dim = (np.int32(x) for x in (self.seq, self.heads, self.kv_heads, self.head_dim))
        capacity, length = np.int32(cache.capacity), backend.kv_length
        scale = np.float32(attention_scale(self.node.param.attnScale, self.head_dim, self.backend.kv_meta))
        n = self.seq * self.kv_heads * self.head_dim
        self.prepare("attention.cu", "kv_append", grid_for(n), (BLOCK,),
                     (seq, kv_heads, dim, capacity, length, k, v, cache.k, cache.v))
        self.prepare("attention.cu", "attention", (self.heads, self.seq), (ATT_TILE,),
                     (seq, heads, kv_heads, dim, capacity, scale, self.window, length, q, cache.k, cache.v, out))
        self.bound_version = cache.version

    def before_launch(self) -> None:
        meta = self.backend.kv_meta
        past = self.cache.apply_reserve(meta.previous - meta.remove, meta.reserve)
        self.backend._set_kv_length(past)

    def launch(self) -> None:
        if self.bound_version != self.cache.version:
            self._prepare()
        super().launch()


def supported(inputs) -> bool:
    q, k = inputs[0].shape, inputs[1].shape
    return len(q) == 4 and len(k) == 4 and q[3] <= MAX_HEAD_DIM and k[2] > 0 and q[2] % k[2] == 0
