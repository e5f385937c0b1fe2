"""MNN's fused Attention op, with each layer's KV cache on the device.

Inputs: q (1, seq, heads, head_dim), k (1, seq, kv_heads, head_dim), v (the same values, seq
first), mask (the kernel masks causally from the kept length; the mask only names a key window,
for a sliding layer: runtime.attention_mask). Two dispatches: append
this step's k and v at the kept length, then attend: `attention` (a workgroup per row and
head, scores through a scratch buffer; GPUs) or `attention_rows` (an invocation per row and head,
online softmax, no barriers; CPU devices). The kept length changes every step while the
commands are recorded once, so onExecute writes it, with the sequence's region of the layer's
KVPool, into the backend's step buffer, which the kernels read, before the submit. A batched
forward (rows of several sequences, continuous batching) writes each row's region and position
into the rows table instead; rows no sequence holds are idle and store nothing. An Attention op with kv_cache false (a vision encoder's) is
VulkanEncoderAttention: no cache, every query over every key, the mask input added.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend.device_caches import Slot
from mnngpu.backend.kv import attention_scale, requantize_int8, reserve_moves
from mnngpu.backend.sequences import segments
from mnngpu.backends.vulkan.ops.base import VulkanExecution, element_groups
from mnngpu.backends.vulkan.program import pack_push
from mnngpu.errors import ConfigError, InputError, MnnGpuError
from mnngpu.ops.attention import key_window

MAX_HEAD_DIM = 256  # attention.comp keeps one query row in shared memory
IDLE_ROW = 0xFFFFFFFF   # a rows-table base: the row is no sequence's (shaders/vulkan/kv_place.glsl)


class KVPool:
    """One layer's keys and values for every sequence the backend runs: a region of
    (kv_heads, capacity, head_dim) per slot, [slot][kv_heads][capacity][head_dim] in one buffer per
    side, of the backend's store_dtype; with `int8` (keys, values; attention_mode 1 and 2) that side
    holds int8 codes four to a uint, beside a float32 scale per (slot, kv head, token)
    (shaders/vulkan/kv_int8.glsl). The recorded commands bind these buffers, so every sequence's
    forward runs the same commands: the kernels find a sequence's region from the step buffer or
    the rows table (shaders/vulkan/kv_place.glsl). More sequences grow it (`grow`)."""

    def __init__(self, backend, kv_heads: int, head_dim: int, capacity: int, int8: tuple[bool, bool], slots: int):
        self.kv_heads, self.head_dim, self.capacity, self.int8 = kv_heads, head_dim, capacity, int8
        self.region_rows = kv_heads * capacity   # cache rows (kv head, token) of one slot
        store = backend.store_dtype
        rows = slots * self.region_rows

        def side(quantized: bool):
            if quantized:
                codes = backend._new_buffer(rows * head_dim, np.uint32)
                return codes, backend._new_buffer(rows * 4, np.float32)
            return backend._new_buffer(rows * head_dim * store.itemsize, store), None

        (self.k, self.k_scale), (self.v, self.v_scale) = side(int8[0]), side(int8[1])
        # every (buffer, bytes per (head, token) row) that moves with a token
        self.parts = [(a, a.nbytes // rows) for a in (self.k, self.v, self.k_scale, self.v_scale) if a is not None]
        self.spare = backend._new_buffer(capacity * max(row for _, row in self.parts), np.uint8)

    @property
    def variant(self) -> str:
        """The kernel variant for this cache: "" (store_dtype), "k8" (then store_dtype's) or "kv8"."""
        return {(False, False): "", (True, False): "k8", (True, True): "kv8"}[self.int8]

    @property
    def scales(self) -> list:
        return [a for a in (self.k_scale, self.v_scale) if a is not None]

    @property
    def slot_bytes(self) -> int:
        """Bytes of the largest buffer's region of one slot."""
        return max(self.region_rows * row for _, row in self.parts)

    def grow(self, slots: int) -> None:
        """Room for `slots` sequences, the present ones' regions kept."""
        for buffer, row in self.parts:
            buffer.grow(slots * self.region_rows * row)


class KVCache:
    """One layer's cache of one sequence (a backend.kv.KVCache): its slot's region of the layer's KVPool."""

    def __init__(self, pool: KVPool, slot: Slot):
        self.pool, self.slot = pool, slot
        self.kv_heads, self.head_dim, self.capacity = pool.kv_heads, pool.head_dim, pool.capacity

    @property
    def base(self) -> int:
        """The region's first cache row (kv head, token), as the kernels index rows."""
        return self.slot.index * self.pool.region_rows

    @property
    def k(self):
        """The keys' buffer: the pool's, which every slot's region is part of."""
        return self.pool.k

    @property
    def v(self):
        return self.pool.v

    @property
    def nbytes(self) -> int:
        return sum(self.pool.region_rows * row for _, row in self.pool.parts)

    def reset(self) -> None:
        for buffer, row in self.pool.parts:
            buffer.write_range(np.zeros(self.pool.region_rows * row, np.uint8).view(buffer.dtype), self.base * row)

    def _region(self, buffer, row: int) -> np.ndarray:
        return buffer.read_range(self.base * row, self.pool.region_rows * row)

    def read(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """The first `length` keys and values, float32 (kv_heads, length, head_dim) each."""
        pool = self.pool
        return self._read_side(pool.k, pool.k_scale, length), self._read_side(pool.v, pool.v_scale, length)

    def _read_side(self, buffer, scales, length: int) -> np.ndarray:
        rows = self._rows(buffer, scales is not None)[:, :length].astype(np.float32)
        if scales is not None:
            rows *= self._region(scales, 4).reshape(self.kv_heads, self.capacity)[:, :length, None]
        return rows

    def _rows(self, buffer, int8: bool) -> np.ndarray:
        values = self._region(buffer, self.head_dim if int8 else self.head_dim * buffer.dtype.itemsize)
        return (values.view(np.int8) if int8 else values).reshape(self.kv_heads, self.capacity, self.head_dim)

    def write(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Hold exactly these keys and values (kv_heads, length, head_dim), coded as this cache codes them."""
        length = keys.shape[1]
        if length > self.capacity:
            raise InputError(f"{length} stored tokens exceed the Vulkan KV cache of {self.capacity}",
                             field="max_all_tokens")
        pool = self.pool
        for buffer, scales, array in ((pool.k, pool.k_scale, keys), (pool.v, pool.v_scale, values)):
            rows = self._rows(buffer, scales is not None)
            if scales is None:
                rows[:, :length] = array
            else:
                codes, scale = requantize_int8(array)
                rows[:, :length] = codes
                all_scales = self._region(scales, 4).reshape(self.kv_heads, self.capacity)
                all_scales[:, :length] = scale
                scales.write_range(all_scales, self.base * 4)
            row = rows.nbytes // pool.region_rows
            buffer.write_range(rows.reshape(-1).view(buffer.dtype), self.base * row)

    def apply_reserve(self, start: int, reserve: list[tuple[int, int]]) -> int:
        """Move the kept spans of a removed region together behind `start`; returns the new end.
        Spans may overlap their destination, so each goes through the spare buffer."""
        moves, end = reserve_moves(start, reserve)
        pool = self.pool
        regions = []
        for move in moves:
            for cache, row in pool.parts:
                nbytes = move.length * row
                for head in range(self.kv_heads):
                    base = self.base + head * self.capacity
                    regions.append((cache.buffer, (base + move.source) * row, pool.spare.buffer, 0, nbytes))
                    regions.append((pool.spare.buffer, 0, cache.buffer, (base + move.target) * row, nbytes))
        if regions:
            pool.k.arena.copy(regions)
        return end


class VulkanAttention(VulkanExecution):
    @classmethod
    def variant_for(cls, inputs, node):
        return cls if node.param.kv_cache else VulkanEncoderAttention

    @classmethod
    def decline(cls, inputs, outputs, node):
        _, _, heads, dim = inputs[0].shape
        kv_heads = inputs[1].shape[2]
        if dim > MAX_HEAD_DIM:
            return f"head dim {dim} is over the kernels' {MAX_HEAD_DIM}"
        if heads % kv_heads:
            return f"{heads} query heads are not a multiple of {kv_heads} kv heads"
        return None

    def _check_int8_head_dim(self, dim: int) -> None:
        if any(self.pool.int8) and dim % 4:
            raise ConfigError(f"the vulkan backend's int8 KV cache packs 4 codes a word: head_dim {dim} is not a "
                              "multiple of 4; use a multiple of 8", field="attention_mode")

    def onResize(self, inputs, outputs):
        backend = self.backend
        _, seq, heads, dim = inputs[0].shape
        kv_heads = inputs[1].shape[2]
        self.seq, self.kv_heads, self.dim = seq, kv_heads, dim
        self.pool = pool = backend._kv_pool(self.node.param.layer_index, kv_heads, dim)
        self._check_int8_head_dim(dim)
        # a batched decode module (resized inside a batched forward) places each row by the rows table
        self.batched = backend.batch is not None
        if self.batched and seq > backend.rows_table_rows:
            raise ConfigError(f"a batched forward of {seq} rows: the Vulkan backend places at most "
                              f"{backend.rows_table_rows}; use fewer --parallel slots", field="parallel")
        capacity = pool.capacity
        q, k, v = (t.device for t in inputs[:3])
        out = outputs[0].device = backend._new_tensor(outputs[0])
        places = [backend.step, backend.rows_table]
        store = pack_push("5I", seq, kv_heads, dim, capacity, self.batched)
        if pool.variant:   # one invocation per (token, head) row: each finds its row's scale
            written = (4, 5, *range(6, 6 + len(pool.scales)))
            self.dispatch(self._kernel("kv_store_int8"), [k, v, *places, pool.k, pool.v, *pool.scales], store,
                          element_groups(seq * kv_heads), writes=written)
        else:
            self.dispatch(backend._kernel_name("kv_store"), [k, v, *places, pool.k, pool.v], store,
                          element_groups(seq * kv_heads * dim), writes=(-2, -1))
        scale = attention_scale(self.node.param.attnScale, dim, self.backend.kv_meta)
        window = key_window(inputs[3]) if len(inputs) > 3 else 0
        push = pack_push("5If2I", seq, heads, kv_heads, dim, capacity, float(scale), window, self.batched)
        cached = [q, pool.k, pool.v, *places]
        if backend.variant == "cpu" and dim % 4 == 0:
            self.dispatch(self._kernel("attention_rows"), [*cached, out, *pool.scales], push,
                          element_groups(seq * heads), writes=(5,))
        else:
            scores = backend._scratch(seq * heads * capacity * 4)
            self.dispatch(self._kernel("attention"), [*cached, scores, out, *pool.scales], push, seq * heads,
                          writes=(5, 6))

    def _kernel(self, base: str) -> str:
        """The kernel variant for this layer's cache: store_dtype's, or an int8 one."""
        variant = self.pool.variant
        if variant == "kv8":
            return f"{base}_kv8"
        return self.backend._kernel_name(f"{base}_{variant}" if variant else base)

    def onExecute(self, inputs, outputs):
        backend = self.backend
        if self.batched:
            backend._set_rows(self._places())
        elif backend.batch is not None:
            raise MnnGpuError("a Vulkan module recorded for one sequence ran a batched forward")
        else:
            cache = self._cache()
            backend._set_step(self._past(cache, self.seq), cache.base)
        super().onExecute(inputs, outputs)

    def _cache(self) -> KVCache:
        """The current sequence's cache of this layer (its slot taken at its first forward)."""
        return self.backend.kv_cache(self.node.param.layer_index, self.kv_heads, self.dim)

    def _past(self, cache: KVCache, rows: int) -> int:
        """Apply the current sequence's KVMeta (a reserve's moves); the kept length the new rows follow."""
        meta = self.backend.kv_meta
        past = cache.apply_reserve(meta.previous - meta.remove, meta.reserve)
        if past + rows > cache.capacity:
            raise InputError(f"{past} cached + {rows} new tokens exceed the Vulkan KV cache of "
                             f"{cache.capacity} (max_all_tokens plus one prefill chunk)", field="max_all_tokens")
        return past

    def _places(self) -> np.ndarray:
        """Each row's (region base, position) for the rows table; idle rows (no sequence's) IDLE_ROW."""
        places = np.full((self.seq, 2), IDLE_ROW, dtype=np.uint32)
        for segment in segments(self.backend, self.seq):
            start, rows = (0, self.seq) if segment is None else (segment.start, segment.rows)
            cache = self._cache()
            places[start: start + rows, 0] = cache.base
            places[start: start + rows, 1] = self._past(cache, rows) + np.arange(rows)
        return places


class VulkanEncoderAttention(VulkanExecution):
    """kv_cache false: q, k, v (1, seq, heads or kv_heads, head_dim) of this run only, and the
    mask input ([1, seq, seq], [planes, 1, seq, seq], ...) added to the scores (encoder_attention.comp)."""

    decline = VulkanAttention.decline

    def onResize(self, inputs, outputs):
        backend = self.backend
        _, seq, heads, dim = inputs[0].shape
        kv_heads = inputs[1].shape[2]
        mask, planes = backend.placeholder, 0
        if len(inputs) > 3:
            mask, planes = inputs[3].device, int(np.prod(inputs[3].shape)) // (seq * seq)
        out = outputs[0].device = backend._new_tensor(outputs[0])
        scale = attention_scale(self.node.param.attnScale, dim, backend.kv_meta)
        push = pack_push("4IfI", seq, heads, kv_heads, dim, float(scale), planes)
        self.dispatch("encoder_attention", [*(t.device for t in inputs[:3]), mask, out], push,
                      element_groups(seq * heads))


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"Attention": VulkanAttention}
