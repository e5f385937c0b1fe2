"""The OpenCL backend: the whole graph on one OpenCL device, kernels from shaders/opencl.

Fixed-shape (MNN's shapeMutable=false): each pool module is resized once, its kernels get
their buffers and shapes bound then, and every step replays the same kernel list. The KV
cache lives on the device; per step only the graph inputs go up and the logits come down.

A tensor's `device` is a pyopencl Buffer, planned at the end of each resize (memory.py):
activations share a pool by lifetime, and views share their input's buffer. Float tensors are
stored as fp32, or as fp16 under precision low/normal where the device has cl_khr_fp16; int32
tensors as int32. The op table is ops/__init__.py; what its Executions share is ops/base.py.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pyopencl as cl

from mnngpu.backend import Backend, BackendConfig, Capabilities, Node, Tensor, warn_once
from mnngpu.backend.planned import PlannedExecution, Recording
from mnngpu.backends.opencl import memory
from mnngpu.backends.opencl.device import VARIANTS, log, shared_device
from mnngpu.backends.opencl.ops import EXECUTIONS
from mnngpu.backends.opencl.ops.attention import DeviceKVCache
from mnngpu.errors import ConfigError

FLOAT = np.dtype(np.float32)
DEFAULT_MAX_TOKENS = 2048


class OpenCLBackend(Backend):
    type = "opencl"
    caps = Capabilities(fixed_shape=True, encoder_attention=True, kv_int8=True, kv_transfer=True, batched=True)
    executions = EXECUTIONS

    def __init__(self, config: BackendConfig, kv_meta=None, *, variant: str | None = None,
                 half_storage: bool | None = None):
        """`variant` ("cpu" or "gpu" kernels) defaults to $MNNGPU_OPENCL_VARIANT, else the device
        type's; `half_storage` (fp16 tensors) to precision != high on a device with cl_khr_fp16."""
        super().__init__(config, kv_meta)
        self.device = shared_device()
        self.queue = cl.CommandQueue(self.device.context)
        self.variant = variant or os.environ.get("MNNGPU_OPENCL_VARIANT") or self.device.default_variant
        if self.variant not in VARIANTS:
            raise ConfigError(f"OpenCL kernel variant one of {VARIANTS}, got '{self.variant}'", field="variant")
        self.half = self._half_storage(config) if half_storage is None else half_storage
        self.float_storage = np.dtype(np.float16 if self.half else np.float32)
        self.caps = dataclasses.replace(type(self).caps, storage=self.float_storage.name)
        # KV capacity (+ one prefill chunk of padding): MNN's max_all_tokens, once BackendConfig carries it
        self.max_tokens = int(getattr(config, "max_all_tokens", None) or DEFAULT_MAX_TOKENS)
        self.kv_length_buffer = self.device.buffer(4)
        self.placeholder = self.device.buffer(4)  # bound where a kernel's optional buffer is absent
        self._kv_length: int | None = None
        self._in_flight: list[np.ndarray] = []   # host arrays of non-blocking uploads, kept until finish()
        self.pool = memory.BufferPool(self.device.buffer)   # activations, shared by the pipelines
        self.recording = Recording(self._plan_buffers)
        self._pinned: set[int] = set()           # id()s of tensors another backend copies out
        self._scratch_buffers: dict[int, cl.Buffer] = {}
        self.description = f"opencl on {self.device.name} ({'CPU' if self.device.is_cpu else 'GPU'})"
        log.info("OpenCL on %s, %s kernels, %s storage", self.device.name, self.variant, self.float_storage.name)
        if self.device.is_cpu:
            warn_once(f"OpenCL runs on {self.device.name}, a CPU device: no OpenCL GPU was found")

    def _half_storage(self, config: BackendConfig) -> bool:
        if config.precision == "high":
            return False
        if self.device.has_fp16:
            return True
        warn_once(f"OpenCL device {self.device.name} has no cl_khr_fp16: precision '{config.precision}' "
                 "runs with fp32 storage")
        return False

    # ---- ops ----------------------------------------------------------------------------------
    def declined(self, inputs: list[Tensor], outputs: list[Tensor], node: Node) -> None:
        self._pinned.update(id(t) for t in inputs)  # the CPU backup will copy them out

    def _kernel(self, source: str, name: str, defines: dict) -> cl.Kernel:
        """A new instance (its own bound arguments) of kernel `name` of shaders/opencl/<source>."""
        storage = {"HALF_STORAGE": 1} if self.half else {}
        if self.half and self.device.has_fp16:
            storage["HAS_FP16_EXTENSION"] = 1
        return cl.Kernel(self.device.program(source, {**storage, **defines}), name)

    # ---- the KV cache ---------------------------------------------------------------------------
    def kv_cache(self, layer: int, kv_heads: int, head_dim: int) -> DeviceKVCache:
        """int8 keys (and values) per kv_quant (attention_mode 1 and 2, ops/attention.py)."""
        if layer not in self.kv_caches:
            int8 = (self.config.kv_quant >= 1, self.config.kv_quant == 2)
            capacity = self.max_tokens + self.config.prefill_len
            self.kv_caches[layer] = DeviceKVCache(self, kv_heads, head_dim, capacity, int8)
        return self.kv_caches[layer]

    def _set_kv_length(self, length: int) -> None:
        """Tokens kept in front of this step's new ones, for every Attention kernel to read."""
        if length != self._kv_length:
            self._write(self.kv_length_buffer, np.array([length], dtype=np.int32))
            self._kv_length = length

    # ---- resize: record, then plan the buffers and bind (mnngpu/backend/planned.py) -------------------
    def onResizeBegin(self) -> None:
        self.recording.begin()

    def onResizeEnd(self) -> None:
        self.recording.end()

    def _plan_buffers(self, executions: list[PlannedExecution]) -> None:
        if self.config.keep_tensors:
            self._pinned.update(id(t) for e in executions for t in e.outputs)
        memory.plan(executions, self.pool, self._nbytes, self._own_buffer, self._pinned)

    # ---- memory -----------------------------------------------------------------------------------
    def _itemsize_of(self, dtype) -> int:
        return self.float_storage.itemsize if np.dtype(dtype) == FLOAT else np.dtype(dtype).itemsize

    def _itemsize(self, tensor: Tensor) -> int:
        return self._itemsize_of(tensor.dtype)

    def _storage_dtype(self, tensor: Tensor) -> np.dtype:
        return self.float_storage if np.dtype(tensor.dtype) == FLOAT else np.dtype(tensor.dtype)

    def _nbytes(self, tensor: Tensor) -> int:
        return tensor.size * self._itemsize(tensor)

    def alloc(self, tensor: Tensor) -> None:
        """Buffers are planned together at onResizeEnd (memory.py); nothing to reserve one by one."""

    def _own_buffer(self, tensor: Tensor) -> cl.Buffer:
        return self.device.buffer(self._nbytes(tensor))

    def _buffer(self, tensor: Tensor) -> cl.Buffer:
        """The tensor's buffer; one of its own when it has none yet (a graph input, a constant)."""
        if tensor.device is None:
            tensor.device = self._own_buffer(tensor)
        return tensor.device

    def _scratch(self, elements: int) -> cl.Buffer:
        """Float working memory of `elements` in float storage, shared by every kernel that asks for
        that size (the queue runs them in order)."""
        nbytes = elements * self.float_storage.itemsize
        if nbytes not in self._scratch_buffers:
            self._scratch_buffers[nbytes] = self.device.buffer(nbytes)
        return self._scratch_buffers[nbytes]

    def _or_placeholder(self, buffer: cl.Buffer | None) -> cl.Buffer:
        return self.placeholder if buffer is None else buffer

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        data = np.ascontiguousarray(np.asarray(array).reshape(tensor.shape),
                                    dtype=self._storage_dtype(tensor))
        self._write(self._buffer(tensor), data)

    def _write(self, buffer: cl.Buffer, data: np.ndarray) -> None:
        if data.nbytes:
            cl.enqueue_copy(self.queue, buffer, data, is_blocking=False)
            self._in_flight.append(data)

    def download(self, tensor: Tensor) -> np.ndarray:
        host = np.empty(tensor.shape, dtype=self._storage_dtype(tensor))
        if host.nbytes:
            cl.enqueue_copy(self.queue, host, self._buffer(tensor), is_blocking=True)
        self._in_flight.clear()  # the queue is in order: every earlier upload is done
        return host.astype(tensor.dtype, copy=False)

    def finish(self) -> None:
        self.queue.finish()
        self._in_flight.clear()
