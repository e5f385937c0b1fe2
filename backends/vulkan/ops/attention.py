"""MNN's fused Attention op, with each layer's KV cache on the device.

Inputs: q (1, seq, heads, head_dim), k (1, seq, kv_heads, head_dim), v (the same values, seq
first), mask (not read: the kernel masks causally from the kept length). Two dispatches: append
this step's k and v at the kept length, then attend: `attention` (a workgroup per row and
head, scores through a scratch buffer; GPUs) or `attention_rows` (an invocation per row and head,
online softmax, no barriers; CPU devices). The kept length changes every step while the
commands are recorded once, so onExecute writes it into the backend's step buffer, which the
kernels read, before the submit.
"""

from __future__ import annotations

from mnngpu.backends.vulkan.ops.base import VulkanExecution, element_groups
from mnngpu.backends.vulkan.program import pack_push
from mnngpu.errors import InputError
from mnngpu.runtime.kv import attention_scale, reserve_moves

MAX_HEAD_DIM = 256  # attention.comp keeps one query row in shared memory


class KVCache:
    """One layer's keys and values: (kv_heads, capacity, head_dim) each, of the backend's store_dtype."""

    def __init__(self, backend, kv_heads: int, head_dim: int, capacity: int):
        self.kv_heads, self.head_dim, self.capacity = kv_heads, head_dim, capacity
        dtype = backend.store_dtype
        self.k = backend.new_buffer(kv_heads * capacity * head_dim * dtype.itemsize, dtype)
        self.v = backend.new_buffer(kv_heads * capacity * head_dim * dtype.itemsize, dtype)
        self.spare = backend.new_buffer(capacity * head_dim * dtype.itemsize, dtype)

    def apply_reserve(self, start: int, reserve: list[tuple[int, int]]) -> int:
        """Move the kept spans of a removed region together behind `start`; returns the new end.
        Spans may overlap their destination, so each goes through the spare buffer."""
        row = self.head_dim * self.k.dtype.itemsize
        moves, end = reserve_moves(start, reserve)
        regions = []
        for move in moves:
            nbytes = move.length * row
            for cache in (self.k, self.v):
                for head in range(self.kv_heads):
                    base = head * self.capacity
                    regions.append((cache.buffer, (base + move.source) * row, self.spare.buffer, 0, nbytes))
                    regions.append((self.spare.buffer, 0, cache.buffer, (base + move.target) * row, nbytes))
        if regions:
            self.k.arena.copy(regions)
        return end


class VulkanAttention(VulkanExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        _, _, heads, dim = inputs[0].shape
        kv_heads = inputs[1].shape[2]
        if dim > MAX_HEAD_DIM:
            return f"head dim {dim} is over the kernels' {MAX_HEAD_DIM}"
        if heads % kv_heads:
            return f"{heads} query heads are not a multiple of {kv_heads} kv heads"
        return None

    def onResize(self, inputs, outputs):
        backend = self.backend
        _, seq, heads, dim = inputs[0].shape
        kv_heads = inputs[1].shape[2]
        self.seq = seq
        self.cache = backend.kv_cache(self.node.param.layer_index, kv_heads, dim)
        capacity = self.cache.capacity
        q, k, v = (t.device for t in inputs[:3])
        out = outputs[0].device = backend.new_tensor(outputs[0])
        self.dispatch(backend.kernel_name("kv_store"), [k, v, backend.step, self.cache.k, self.cache.v],
                      pack_push("4I", seq, kv_heads, dim, capacity), element_groups(seq * kv_heads * dim), writes=(-2, -1))
        scale = attention_scale(self.node.param.attnScale, dim, self.backend.kv_meta)
        push = pack_push("5If", seq, heads, kv_heads, dim, capacity, float(scale))
        cached = [q, self.cache.k, self.cache.v, backend.step]
        if backend.variant == "cpu" and dim % 4 == 0:
            self.dispatch(backend.kernel_name("attention_rows"), [*cached, out], push, element_groups(seq * heads))
        else:
            scores = backend.scratch(seq * heads * capacity * 4)
            self.dispatch(backend.kernel_name("attention"), [*cached, scores, out], push, seq * heads, writes=(-2, -1))

    def onExecute(self, inputs, outputs):
        meta = self.backend.kv_meta
        past = self.cache.apply_reserve(meta.previous - meta.remove, meta.reserve)
        if past + self.seq > self.cache.capacity:
            raise InputError(f"{past} cached + {self.seq} new tokens exceed the Vulkan KV cache of "
                             f"{self.cache.capacity} (max_all_tokens plus one prefill chunk)", field="max_all_tokens")
        self.backend.set_step(past)
        super().onExecute(inputs, outputs)

