"""MNN's fused Attention on the device, with each layer's KV cache kept on the device.

The kernels are prepared once per module (sized for the cache's capacity) and read how
many tokens the cache already holds from a one-int device buffer the backend writes before
the step (OpenCLBackend.set_kv_length), so the same prepared kernels serve every prompt length
and every decode step. Inputs: q (1, seq, heads, head_dim), k (1, seq, kv_heads, head_dim),
v (the same values seq-major, any shape), mask (the kernels mask causally; the mask only names
a key window, for a sliding layer: runtime.attention_mask). An Attention op with kv_cache false
(a vision encoder's) is OpenCLEncoderAttention: no cache, every query over every key, the
mask input added to the scores.

Several sequences: each has its own caches (`kv_caches`), and the kernels are bound to the current
sequence's before they run (`_bind_cache`). A batched forward (rows of several sequences,
continuous batching) launches the kernels once per sequence's rows, at a global offset, with the
kept length written as `past - first row` so that the kernels' row index lands on the sequence's
positions; rows no sequence holds are not launched (they store nothing).
"""

from __future__ import annotations

import math

import numpy as np
import pyopencl as cl

from mnngpu.backend.kv import attention_scale, grown_capacity, requantize_int8, reserve_moves
from mnngpu.backend.sequences import segments
from mnngpu.backends.opencl.ops.base import FLAT_GROUP, Launch, OpenCLExecution
from mnngpu.errors import MnnGpuError
from mnngpu.ops.attention import key_window

ATT_WG = 64  # attention_group's work-group size (attention.cl)


class DeviceKVCache:
    """One layer's keys and values (a backend.kv.KVCache): real_t [kv_heads, capacity, head_dim]
    each, or int8 codes with a float scale per [kv_heads, capacity] row (`int8`: keys, values;
    attention_mode 1, 2)."""

    def __init__(self, backend, kv_heads: int, head_dim: int, capacity: int, int8: tuple[bool, bool] = (False, False)):
        self.backend = backend
        self.kv_heads, self.head_dim, self.capacity, self.int8 = kv_heads, head_dim, capacity, int8
        real = backend._itemsize_of(np.float32)
        # (attribute, bytes per [head, token] row); scales only where quantized
        self.parts = [("k", head_dim * (1 if int8[0] else real)), ("v", head_dim * (1 if int8[1] else real))]
        self.parts += [(name, 4) for name, quantized in (("k_scale", int8[0]), ("v_scale", int8[1])) if quantized]
        for name, row_bytes in self.parts:
            setattr(self, name, backend.device.buffer(kv_heads * capacity * row_bytes))
        for name, quantized in (("k_scale", int8[0]), ("v_scale", int8[1])):
            if not quantized:
                setattr(self, name, backend.placeholder)
        self.version = 0  # bumped when the buffers are replaced, so kernels bind the new ones

    @property
    def nbytes(self) -> int:
        return sum(self.kv_heads * self.capacity * row_bytes for _, row_bytes in self.parts)

    def reset(self) -> None:
        for name, row_bytes in self.parts:
            cl.enqueue_fill_buffer(self.backend.queue, getattr(self, name), np.uint8(0), 0,
                                   self.kv_heads * self.capacity * row_bytes)

    def ensure(self, length: int) -> None:
        """Room for `length` tokens (backend.kv.grown_capacity)."""
        capacity = grown_capacity(self.capacity, length)
        if capacity == self.capacity:
            return
        for name, row_bytes in self.parts:
            setattr(self, name, self._grown(getattr(self, name), capacity, row_bytes))
        self.capacity = capacity
        self.version += 1

    def _grown(self, old: cl.Buffer, capacity: int, row_bytes: int) -> cl.Buffer:
        new = self.backend.device.buffer(self.kv_heads * capacity * row_bytes)
        for h in range(self.kv_heads):
            cl.enqueue_copy(self.backend.queue, new, old, byte_count=self.capacity * row_bytes,
                            src_offset=h * self.capacity * row_bytes, dst_offset=h * capacity * row_bytes)
        return new

    def apply_reserve(self, start: int, reserve: list[tuple[int, int]]) -> int:
        """Move the kept (begin, length) spans of a removed region together behind `start`;
        returns the new end. Rare, so it goes through a scratch buffer (OpenCL copies may not overlap)."""
        moves, end = reserve_moves(start, reserve)
        for move in moves:
            for name, row_bytes in self.parts:
                buffer, nbytes = getattr(self, name), move.length * row_bytes
                scratch = self.backend.device.buffer(nbytes)
                for h in range(self.kv_heads):
                    head = h * self.capacity
                    self._copy(buffer, scratch, (head + move.source) * row_bytes, 0, nbytes)
                    self._copy(scratch, buffer, 0, (head + move.target) * row_bytes, nbytes)
        return end

    def read(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """The first `length` keys and values, float32 (kv_heads, length, head_dim) each."""
        return self._read_side("k", length), self._read_side("v", length)

    def _read_side(self, name: str, length: int) -> np.ndarray:
        int8 = self.int8[name == "v"]
        dtype = np.int8 if int8 else self.backend.float_storage
        values = self._rows(getattr(self, name), dtype, (length, self.head_dim), length)
        if int8:
            return values.astype(np.float32) * self._rows(getattr(self, name + "_scale"), np.float32, (length,),
                                                          length)[..., None]
        return values.astype(np.float32)

    def _rows(self, buffer: cl.Buffer, dtype, row_shape: tuple[int, ...], length: int) -> np.ndarray:
        """Each head's first `length` rows of `buffer`: (kv_heads, *row_shape)."""
        host = np.empty((self.kv_heads, *row_shape), dtype=dtype)
        head_bytes = self.capacity * host[0, 0].nbytes
        for h in range(self.kv_heads):
            cl.enqueue_copy(self.backend.queue, host[h], buffer, src_offset=h * head_bytes, is_blocking=True)
        return host

    def write(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Hold exactly these keys and values (kv_heads, length, head_dim), coded as this cache codes them."""
        self.ensure(keys.shape[1])
        for name, array in (("k", keys), ("v", values)):
            if self.int8[name == "v"]:
                codes, scales = requantize_int8(array)
                self._write_rows(getattr(self, name), codes)
                self._write_rows(getattr(self, name + "_scale"), scales)
            else:
                self._write_rows(getattr(self, name), np.asarray(array, dtype=self.backend.float_storage))

    def _write_rows(self, buffer: cl.Buffer, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows)
        head_bytes = self.capacity * rows[0, 0].nbytes
        for h in range(self.kv_heads):
            cl.enqueue_copy(self.backend.queue, buffer, rows[h], dst_offset=h * head_bytes, is_blocking=True)

    def _copy(self, src: cl.Buffer, dst: cl.Buffer, src_offset: int, dst_offset: int, nbytes: int) -> None:
        cl.enqueue_copy(self.backend.queue, dst, src, byte_count=nbytes, src_offset=src_offset, dst_offset=dst_offset)


class OpenCLAttention(OpenCLExecution):
    """With the KV cache (an LLM's); an encoder's Attention runs as OpenCLEncoderAttention."""

    @classmethod
    def variant_for(cls, inputs, node):
        return cls if node.param.kv_cache else OpenCLEncoderAttention

    def plan(self, inputs, outputs):
        _, seq, heads, dim = inputs[0].shape
        kv_heads = inputs[1].shape[2]
        backend = self.backend
        self.seq, self.kv_heads, self.dim = seq, kv_heads, dim
        self.batched = backend.batch is not None   # a batched decode module: launched per sequence
        self.cache = backend.kv_cache(self.node.param.layer_index, kv_heads, dim)
        scale = attention_scale(self.node.param.attnScale, dim, self.backend.kv_meta)
        cache, kv_length = self.cache, backend.kv_length_buffer
        defines = {"HEAD_DIM": dim, **{name: 1 for name, on in zip(("KEY_INT8", "VALUE_INT8"), cache.int8) if on}}
        append_args = [cache.k, cache.v, inputs[1], inputs[2], kv_length, np.int32(kv_heads), np.int32(cache.capacity)]
        if any(cache.int8):   # one work-item per (token, head) row: each finds its row's scale
            rows = seq * kv_heads
            self.append = self.prepare("attention.cl", "kv_append_int8",
                                       [*append_args, np.int32(rows), cache.k_scale, cache.v_scale], (rows,),
                                       defines=defines)
            self.append_row = kv_heads   # work-items per row
        else:
            n = seq * kv_heads * dim
            self.append = self.prepare("attention.cl", "kv_append", [*append_args, np.int32(n)], (n,),
                                       defines=defines)
            self.append_row = kv_heads * dim
        args = [outputs[0], inputs[0], cache.k, cache.v, kv_length, np.int32(seq),
                np.int32(heads), np.int32(kv_heads), np.int32(cache.capacity), np.float32(scale),
                cache.k_scale, cache.v_scale, np.int32(key_window(inputs[3]) if len(inputs) > 3 else 0)]
        if backend.variant == "cpu" and dim % 4 == 0:
            self.attend = self.prepare("attention.cl", "attention_rows", args, (heads, seq), (1, 1), defines)
        else:
            self.attend = self.prepare("attention.cl", "attention_group", args, (heads * ATT_WG, seq), (ATT_WG, 1),
                                       defines)
        self.bound_version = cache.version

    def _bind_cache(self) -> None:
        cache = self.cache
        quantized = any(cache.int8)
        for launch, (k_arg, v_arg, capacity_arg, scale_arg) in ((self.append, (0, 1, 6, 8 if quantized else None)),
                                                                (self.attend, (2, 3, 8, 10))):
            launch.args[k_arg], launch.args[v_arg] = cache.k, cache.v
            launch.args[capacity_arg] = np.int32(cache.capacity)
            if scale_arg is not None:
                launch.args[scale_arg], launch.args[scale_arg + 1] = cache.k_scale, cache.v_scale
        self.bind()
        self.bound_version = cache.version

    def onExecute(self, inputs, outputs):
        if not self.batched:
            if self.backend.batch is not None:
                raise MnnGpuError("an OpenCL module prepared for one sequence ran a batched forward")
            self._prepare_sequence(self.seq)
            super().onExecute(inputs, outputs)
            return
        for segment in segments(self.backend, self.seq):
            start, rows = (0, self.seq) if segment is None else (segment.start, segment.rows)
            self._prepare_sequence(rows, start)
            self._launch_rows(start, rows)

    def _prepare_sequence(self, rows: int, start: int = 0) -> None:
        """Bind the current sequence's cache, apply its KVMeta, and write its kept length, less the
        first row `start` (the kernels add the row index, counted from the forward's first row)."""
        backend = self.backend
        cache = backend.kv_cache(self.node.param.layer_index, self.kv_heads, self.dim)
        meta = backend.kv_meta
        past = cache.apply_reserve(meta.previous - meta.remove, meta.reserve)
        cache.ensure(past + rows)
        if cache is not self.cache or cache.version != self.bound_version:
            self.cache = cache
            self._bind_cache()
        backend._set_kv_length(past - start)

    def _launch_rows(self, start: int, rows: int) -> None:
        """The kernels over rows [start, start + rows) only, at a global offset (no rounding up,
        which would run into the next sequence's rows)."""
        queue = self.backend.queue
        append: Launch = self.append
        group = (math.gcd(self.append_row, FLAT_GROUP[0]),)   # one size for every launch: one PoCL compile
        cl.enqueue_nd_range_kernel(queue, append.kernel, (rows * self.append_row,), group,
                                   global_work_offset=(start * self.append_row,))
        attend: Launch = self.attend
        cl.enqueue_nd_range_kernel(queue, attend.kernel, (attend.global_size[0], rows), attend.local_size,
                                   global_work_offset=(0, start))


class OpenCLEncoderAttention(OpenCLExecution):
    """kv_cache false: q, k, v (1, seq, heads or kv_heads, head_dim) of this run only, and the
    mask input ([1, seq, seq], [planes, 1, seq, seq], ...) added to the scores."""

    def plan(self, inputs, outputs):
        _, seq, heads, dim = inputs[0].shape
        kv_heads = inputs[1].shape[2]
        scale = attention_scale(self.node.param.attnScale, dim, self.backend.kv_meta)
        mask, planes = self.backend.placeholder, 0
        if len(inputs) > 3:
            mask, planes = inputs[3], int(np.prod(inputs[3].shape)) // (seq * seq)
        args = [outputs[0], inputs[0], inputs[1], inputs[2], mask, np.int32(seq), np.int32(heads),
                np.int32(kv_heads), np.float32(scale), np.int32(planes)]
        self.prepare("attention.cl", "encoder_attention", args, (heads, seq), (1, 1), {"HEAD_DIM": dim})


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"Attention": OpenCLAttention}
