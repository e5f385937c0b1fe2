"""The Vulkan backend: SPIR-V compute shaders (shaders/vulkan) on the `vulkan` (cffi) binding.

Fixed shape: each pool module is resized once; its dispatches are recorded into command
buffers at the end of that resize and resubmitted every step (program.py). Per step only the
embedding rows and positions go up, the kept KV length is written into a small step buffer,
and the logits come down. Weights stay int4/int8 on the device, the KV cache lives there.

Several sequences (continuous batching): each layer's KV cache is one buffer with a region per
sequence (ops/attention.py KVPool), so the commands recorded once serve every sequence. A
sequence takes a slot at its first forward and gives it back when dropped; more sequences than
slots grow every pool, and the recorded commands are recorded again over the moved buffers. A
batched decode forward places each row from the rows table.

Storage: activations are float32 at every precision. At precision low or normal, on a device
with shaderFloat16 and 16-bit storage buffers, the KV cache and unquantized weights are fp16
(`store_dtype`): that is where the bytes are. fp16 activations were measured to cost the whole
2e-2 x logit-std budget on the fixtures, for a small share of the memory traffic.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import weakref

import numpy as np

from mnngpu.backend import Backend, BackendConfig, Capabilities, Tensor, warn_once
from mnngpu.backend.device_caches import PooledKVCaches
from mnngpu.backend.kv import KVMeta
from mnngpu.backends.vulkan.device import VulkanDevice, shared_device
from mnngpu.backends.vulkan.memory import DeviceTensor, MemoryArena
from mnngpu.backends.vulkan.ops import EXECUTIONS
from mnngpu.backends.vulkan.ops.attention import KVCache, KVPool
from mnngpu.backends.vulkan.program import CommandSegment, DescriptorAllocator, Dispatch
from mnngpu.errors import ConfigError, ModelFormatError

DEFAULT_MAX_TOKENS = 2048
ROWS_TABLE_ROWS = 256   # rows a batched forward may place (the rows table's size)
VARIANT_ENV = "MNNGPU_VULKAN_VARIANT"   # "cpu" | "gpu": the kernel family, chosen by device type otherwise


class VulkanBackend(PooledKVCaches, Backend):
    pooled_cache = KVCache   # a sequence's region of a layer's pool (backend.device_caches.PooledKVCaches)
    type = "vulkan"
    # kv_int8: attention_mode 1 and 2 (ops/attention.py); storage: the KV cache's and dense weights'
    caps = Capabilities(fixed_shape=True, encoder_attention=True, kv_int8=True, kv_transfer=True, batched=True)
    executions = EXECUTIONS

    def __init__(self, config: BackendConfig, kv_meta=None):
        super().__init__(config, kv_meta if kv_meta is not None else KVMeta())
        self.device: VulkanDevice = shared_device()
        self.fp16 = not config.fp32 and self.device.fp16
        self._warn_drops(config)
        self.store_dtype = np.dtype(np.float16 if self.fp16 else np.float32)  # KV cache, dense weights
        self.caps = dataclasses.replace(type(self).caps, storage=self.store_dtype.name)
        self.max_binding_bytes = self.device.max_binding_bytes
        self.max_tokens = int(getattr(config, "max_all_tokens", None) or DEFAULT_MAX_TOKENS)
        self.variant = self._variant()
        self.arena = MemoryArena(self.device)
        self.step_arena = MemoryArena(self.device, host_visible=True)
        self.descriptors = DescriptorAllocator(self.device)
        self.command_pool = self.device.create_command_pool()
        self.step = self._new_buffer(16, np.int32, self.step_arena)   # uint past, base: kept KV length, region
        # a batched forward's (region base, position) per row (shaders/vulkan/kv_place.glsl)
        self.rows_table_rows = ROWS_TABLE_ROWS
        self.rows_table = self._new_buffer(ROWS_TABLE_ROWS * 8, np.uint32, self.step_arena)
        self.kv_pools: dict[int, KVPool] = {}   # layer index -> every sequence's keys and values
        self._start_slots()
        self._recorded: weakref.WeakSet[CommandSegment] = weakref.WeakSet()   # recorded again when pools grow
        self.placeholder = self._new_buffer(16, np.float32)            # bound where a kernel ignores a buffer
        self._scratch_tensors: dict[int, DeviceTensor] = {}
        self._segments: list[CommandSegment] = []
        self._due: list[CommandSegment] = []
        self.description = f"vulkan on {self.device.name} ({'CPU' if self.device.is_cpu else 'GPU'})"

    def _warn_drops(self, config: BackendConfig) -> None:
        name = self.device.name
        if self.device.is_cpu:
            warn_once(f"Vulkan runs on {name}, a CPU device: no Vulkan GPU was found")
        if not config.fp32 and not self.device.fp16:
            warn_once(f"Vulkan device {name} lacks shaderFloat16 or 16-bit storage: precision "
                      f"'{config.precision}' runs in fp32")

    def _variant(self) -> str:
        """Kernels for CPU devices avoid barriers and shared memory; GPUs get workgroup kernels."""
        wanted = os.environ.get(VARIANT_ENV)
        if wanted is None:
            return "cpu" if self.device.is_cpu else "gpu"
        if wanted not in ("cpu", "gpu"):
            raise ConfigError(f"{VARIANT_ENV}={wanted!r}: expected cpu or gpu", field=VARIANT_ENV)
        return wanted

    # ---- resize -------------------------------------------------------------------------------
    def declined(self, inputs, outputs, node):
        self._close_segment()   # the CPU backup runs this op between two submits

    def onResizeBegin(self) -> None:
        self._segments = [CommandSegment()]

    def onResizeEnd(self) -> None:
        for segment in self._segments:
            if segment.dispatches:
                for tensor in segment.tensors():
                    self._materialize(tensor)
                segment.record(self.device, self.command_pool, self.descriptors)
                self._recorded.add(segment)
        self._segments = []

    def _record(self, dispatch: Dispatch) -> CommandSegment:
        segment = self._segments[-1]
        segment.add(dispatch)
        return segment

    def _close_segment(self) -> None:
        if self._segments and self._segments[-1].dispatches:
            self._segments.append(CommandSegment())

    def _materialize(self, tensor: DeviceTensor) -> None:
        if tensor.nbytes > self.max_binding_bytes:
            raise ModelFormatError(f"a tensor of {tensor.nbytes} bytes exceeds this Vulkan device's "
                                   f"maxStorageBufferRange ({self.max_binding_bytes}); a smaller max_all_tokens "
                                   "shrinks the KV cache and the attention scores", field="backend_type")
        tensor.materialize()

    # ---- tensors ------------------------------------------------------------------------------
    def _new_tensor(self, tensor: Tensor) -> DeviceTensor:
        """Unbound storage for a graph tensor (memory comes at the end of the resize)."""
        dtype = np.dtype(np.float32 if np.dtype(tensor.dtype).kind == "f" else np.int32)
        return DeviceTensor(self.arena, tensor.size * dtype.itemsize, dtype)

    def _new_buffer(self, nbytes: int, dtype, arena: MemoryArena | None = None) -> DeviceTensor:
        tensor = DeviceTensor(arena or self.arena, nbytes, dtype)
        self._materialize(tensor)
        return tensor

    def _constant(self, values: np.ndarray) -> DeviceTensor:
        """Device memory holding `values` now (weights, norms)."""
        values = np.ascontiguousarray(values)
        tensor = self._new_buffer(values.nbytes, values.dtype)
        tensor.write(values)
        return tensor

    def _scratch(self, nbytes: int) -> DeviceTensor:
        """Float32 working memory shared by every dispatch that asks for this size (they run in order)."""
        if nbytes not in self._scratch_tensors:
            self._scratch_tensors[nbytes] = DeviceTensor(self.arena, nbytes, np.float32)
        return self._scratch_tensors[nbytes]

    def _kv_pool(self, layer: int, kv_heads: int, head_dim: int) -> KVPool:
        """Layer `layer`'s keys and values of every sequence, made when absent."""
        pool = self.kv_pools.get(layer)
        if pool is None:
            int8 = (self.config.kv_quant >= 1, self.config.kv_quant == 2)
            capacity = self.max_tokens + self.config.prefill_len
            pool = self.kv_pools[layer] = KVPool(self, kv_heads, head_dim, capacity, int8, self.slots)
        elif (pool.kv_heads, pool.head_dim) != (kv_heads, head_dim):
            raise ModelFormatError(f"layer {layer}'s Attention ops disagree on kv heads / head dim",
                                   field="Attention.layer_index")
        return pool

    def _grow_slots(self, needed: int) -> None:
        """Room for `needed` sequences in every pool (doubling, up to what one buffer may hold), and
        the recorded commands recorded again over the moved buffers. No submitted work is pending:
        submits wait, and the segments due in this forward are recorded again before their submit."""
        slot_bytes = max((pool.slot_bytes for pool in self.kv_pools.values()), default=1)
        fits = self.max_binding_bytes // slot_bytes
        if needed > fits:
            capacity = self.max_tokens + self.config.prefill_len
            raise ConfigError(f"{needed} sequences' KV caches of {capacity} tokens each need {needed * slot_bytes} "
                              f"bytes in one buffer, over this Vulkan device's maxStorageBufferRange "
                              f"({self.max_binding_bytes}): {fits} fit; run fewer sequences at once (--parallel) "
                              "or lower max_all_tokens", field="parallel")
        self.slots = min(max(needed, 2 * self.slots), fits)
        for pool in self.kv_pools.values():
            pool.grow(self.slots)
        for segment in list(self._recorded):
            if segment.command_buffer is not None:
                segment.record(self.device, self.command_pool, self.descriptors)

    def _kernel_name(self, base: str) -> str:
        """The variant of a kernel that reads store_dtype buffers."""
        return f"{base}_{'f16' if self.fp16 else 'f32'}"

    def alloc(self, tensor: Tensor) -> None:
        tensor.device = self._new_tensor(tensor)

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        if tensor.device is None:
            self.alloc(tensor)
        tensor.device.write(np.asarray(array).astype(tensor.device.dtype, copy=False))

    def download(self, tensor: Tensor) -> np.ndarray:
        self.finish()
        values = tensor.device.read()
        return values.astype(tensor.dtype, copy=False).reshape(tensor.shape)

    # ---- run ----------------------------------------------------------------------------------
    def _enqueue(self, segment: CommandSegment) -> None:
        if segment not in self._due:
            self._due.append(segment)

    def _set_step(self, past: int, base: int) -> None:
        """One sequence's forward: the kept KV length, and its region's first cache row."""
        self.step.write(np.array([past, base, 0, 0], dtype=np.int32))

    def _set_rows(self, places: np.ndarray) -> None:
        """A batched forward: each row's (region base, position), uint32 (rows, 2)."""
        self.rows_table.write_range(places, 0)

    def finish(self) -> None:
        due, self._due = self._due, []
        buffers = [s.command_buffer for s in due if s.command_buffer is not None]
        if buffers:
            self.device.submit(buffers)

    def _close(self) -> None:
        """Free this backend's memory, descriptor sets and command buffers (kernels stay shared)."""
        if self.command_pool is None:
            return
        vk, dev = self.device.vk, self.device.device
        vk.vkDestroyCommandPool(dev, self.command_pool, None)
        self.command_pool = None
        self.descriptors.release()
        self.arena.release()
        self.step_arena.release()

    def __del__(self):
        with contextlib.suppress(Exception):  # at interpreter shutdown the binding may be gone already
            self._close()


__all__ = ["VulkanBackend"]
