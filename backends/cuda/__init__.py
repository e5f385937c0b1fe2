"""The CUDA backend: the whole graph on one NVIDIA GPU through cupy, kernels from shaders/cuda.

Fixed-shape (MNN's shapeMutable=false): each pool module is resized once, its launches are
prepared then, and every step replays them; the decode module's launches are captured once
into a CUDA graph and replayed per token (graph.py). The KV cache lives on the device; per
step only the graph inputs and the KV length go up and the logits come down.

A tensor's `device` is a flat cupy array of its storage dtype (memory.py: fp32 at precision
high, else fp16 or bf16; int32 stays int32), made on first use (`_buffer`), so views can share
their input's array instead. The op table is ops/__init__.py; what its Executions share is
ops/base.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mnngpu.backend import Backend, BackendConfig, Capabilities, Node, Tensor
from mnngpu.backends.cuda.device import CudaDevice, log
from mnngpu.backends.cuda.graph import GraphRecorder, Recording
from mnngpu.backends.cuda.memory import Storage, storage_for
from mnngpu.backends.cuda.ops import EXECUTIONS
from mnngpu.backends.cuda.ops.attention import AttentionExecution, DeviceKVCache
from mnngpu.backends.cuda.ops.linear import pack_linear
from mnngpu.backends.cuda.ops.norm import pack_norm
from mnngpu.ops.linear_attention import NO_DEVICE_KERNEL
from mnngpu.ops.routing import ROUTING_OPS
from mnngpu.runtime.kv import KVMeta

FLOAT = np.dtype(np.float32)
NO_ROUTING = ("no MoE routing kernels on CUDA yet: the router's ops and ExpertAdd run on the CPU backup, "
              "one round trip through the host per MoE layer and step")


class CUDABackend(Backend):
    type = "cuda"
    caps = Capabilities(fixed_shape=True, lacking={**{op: NO_ROUTING for op in ROUTING_OPS},
                                                   "LinearAttention": NO_DEVICE_KERNEL})
    executions = EXECUTIONS

    def __init__(self, config: BackendConfig, kv_meta: KVMeta | None = None, *, storage: Storage | None = None):
        """Raises BackendUnavailableError when cupy or a CUDA device is missing."""
        super().__init__(config, kv_meta if kv_meta is not None else KVMeta())
        self.storage = storage or storage_for(config)
        self.caps = dataclasses.replace(type(self).caps, storage=self.storage.format)
        self.device = CudaDevice(self.storage.define)
        self.graphs = GraphRecorder(self.device)
        self.graphs.prepare_run = self._prepare_run
        self.max_tokens = config.max_all_tokens  # KV capacity (+ one prefill chunk of padding)
        self.kv_length = self.device.empty(1, np.int32)
        self._kv_length_value: int | None = None
        self.placeholder = self.device.empty(1, np.float32)  # bound where a kernel's optional buffer is absent
        self._scratch_arrays: dict[str, object] = {}
        self.description = f"cuda on {self.device.name}"
        log.info("CUDA on %s (compute %s), %s storage", self.device.name, self.device.compute_capability,
                 self.storage.name)

    # ---- ops ----------------------------------------------------------------------------------
    def rearrange(self, node: Node) -> None:
        if node.type == "Convolution" and "weight" in node.weights:
            node.weights["cuda"] = pack_linear(self, node.weights.pop("weight"))
        elif node.type == "LayerNorm":
            pack_norm(self, node)

    def onResizeBegin(self) -> None:
        self.graphs.begin_resize()

    def onResizeEnd(self) -> None:
        self.graphs.end_resize()

    # ---- the KV cache ---------------------------------------------------------------------------
    def kv_cache(self, layer: int, kv_heads: int, head_dim: int) -> DeviceKVCache:
        if layer not in self.kv_caches:
            self.kv_caches[layer] = DeviceKVCache(self.device, self.storage, kv_heads, head_dim,
                                                  self.max_tokens + self.config.prefill_len)
        return self.kv_caches[layer]

    def _set_kv_length(self, length: int) -> None:
        """Tokens kept in front of this step's new ones, for every Attention kernel to read."""
        if length != self._kv_length_value:
            with self.device.stream:
                self.kv_length.set(np.array([length], dtype=np.int32), stream=self.device.stream)
            self._kv_length_value = length

    def _prepare_run(self, recording: Recording) -> None:
        """Before a run's first launch: room in every KV cache for this step's tokens."""
        steps = [e.seq for e in recording.executions if isinstance(e, AttentionExecution)]
        if not steps:
            return
        needed = self.kv_meta.kept + max(steps)
        grown = [cache.ensure(needed) for cache in self.kv_caches.values()]
        if any(grown):
            self.graphs.invalidate()

    # ---- memory -----------------------------------------------------------------------------------
    def _storage_dtype(self, tensor: Tensor) -> np.dtype:
        return self.storage.dtype if np.dtype(tensor.dtype) == FLOAT else np.dtype(tensor.dtype)

    def _itemsize(self, tensor: Tensor) -> int:
        return self._storage_dtype(tensor).itemsize

    def alloc(self, tensor: Tensor) -> None:
        """Arrays are made on first use (`_buffer`), so a view can take its input's instead."""

    def _buffer(self, tensor: Tensor):
        if tensor.device is None:
            tensor.device = self.device.empty(tensor.size, self._storage_dtype(tensor))
        return tensor.device

    def _or_placeholder(self, array):
        return self.placeholder if array is None else array

    def _scratch(self, name: str, size: int, dtype) -> object:
        """A flat array of at least `size` elements shared by the uncaptured (prefill) launches."""
        current = self._scratch_arrays.get(name)
        if current is None or current.size < size or current.dtype != np.dtype(dtype):
            current = self.device.empty(size, dtype)
            self._scratch_arrays[name] = current
        return current

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        self.graphs.host_transfer()
        values = np.asarray(array).reshape(-1)
        data = self.storage.to_storage(values) if np.dtype(tensor.dtype) == FLOAT else values.astype(tensor.dtype)
        target = self._buffer(tensor)
        if data.size:
            with self.device.stream:
                target[: data.size].set(np.ascontiguousarray(data), stream=self.device.stream)

    def download(self, tensor: Tensor) -> np.ndarray:
        self.graphs.host_transfer()
        with self.device.stream:
            stored = self._buffer(tensor)[: tensor.size].get(stream=self.device.stream)
        values = self.storage.from_storage(stored) if np.dtype(tensor.dtype) == FLOAT else stored
        return np.asarray(values).reshape(tensor.shape)

    def finish(self) -> None:
        self.graphs.flush()
        self.device.synchronize()
