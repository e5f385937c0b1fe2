"""The CUDA backend: the whole graph on one NVIDIA GPU through cupy, kernels from shaders/cuda.

Fixed-shape (MNN's shapeMutable=false): each pool module is resized once, its launches are
prepared then, and every step replays them; the decode module's launches are captured once
into a CUDA graph and replayed per token (graph.py). The KV cache lives on the device; per
step only the graph inputs and the KV length go up and the logits come down.

A tensor's `device` is a flat cupy array of its storage dtype (storage.py: fp32 at precision
high, else fp16 or bf16; int32 stays int32), made on first use (`buffer`), so views can share
their input's array instead.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend import Backend, BackendConfig, Node, Tensor
from mnngpu.backends.cuda.attention import AttentionExecution, DeviceKVCache
from mnngpu.backends.cuda.attention import supported as attention_supported
from mnngpu.backends.cuda.device import CudaDevice, log
from mnngpu.backends.cuda.elementwise import BinaryExecution, CastExecution, UnaryExecution
from mnngpu.backends.cuda.elementwise import supported as elementwise_supported
from mnngpu.backends.cuda.graph import GraphRecorder, Recording
from mnngpu.backends.cuda.matmul import LinearExecution, pack_linear
from mnngpu.backends.cuda.movement import (
    INDEX_OPS,
    VIEW_OPS,
    ConcatExecution,
    IndexCopyExecution,
    ViewExecution,
)
from mnngpu.backends.cuda.norm import LayerNormExecution, pack_norm
from mnngpu.backends.cuda.storage import Storage, storage_for
from mnngpu.runtime.kv import KVMeta
from mnngpu.runtime.module_pool import PREFILL_LEN
from mnngpu.runtime.routing import ROUTING_OPS

FLOAT = np.dtype(np.float32)
EXECUTIONS = {**{op: ViewExecution for op in VIEW_OPS}, **{op: IndexCopyExecution for op in INDEX_OPS},
              "Concat": ConcatExecution, "BinaryOp": BinaryExecution, "UnaryOp": UnaryExecution,
              "Cast": CastExecution, "LayerNorm": LayerNormExecution, "Convolution": LinearExecution,
              "Attention": AttentionExecution}


class CUDABackend(Backend):
    type = "cuda"
    fixed_shape = True
    executions = EXECUTIONS

    def __init__(self, config: BackendConfig, kv_meta: KVMeta | None = None, *, storage: Storage | None = None):
        """Raises BackendUnavailableError when cupy or a CUDA device is missing."""
        super().__init__(config, kv_meta if kv_meta is not None else KVMeta())
        self.storage = storage or storage_for(config)
        self.device = CudaDevice(self.storage.define)
        self.graphs = GraphRecorder(self.device)
        self.graphs.prepare_run = self._prepare_run
        self.max_tokens = config.max_all_tokens  # KV capacity (+ one prefill chunk of padding)
        self.kv_caches: dict[int, DeviceKVCache] = {}
        self.kv_length = self.device.empty(1, np.int32)
        self._kv_length_value: int | None = None
        self.placeholder = self.device.empty(1, np.float32)  # bound where a kernel's optional buffer is absent
        self._scratch: dict[str, object] = {}
        log.info("CUDA on %s (compute %s), %s storage", self.device.name, self.device.compute_capability,
                 self.storage.name)

    def describe(self) -> str:
        return f"cuda on {self.device.name}"

    # ---- ops ----------------------------------------------------------------------------------
    def decline(self, node: Node, inputs: list[Tensor], outputs: list[Tensor]) -> str | None:
        if node.type in ("BinaryOp", "UnaryOp", "Cast") and not elementwise_supported(node, inputs, outputs):
            return f"no {node.type} kernel for these dtypes or this op"
        if node.type in INDEX_OPS and any(t.host is None for t in inputs[1:]):
            return "indices computed on the device"
        if node.type == "Attention" and not attention_supported(inputs):
            return "no attention kernel for this head layout"
        if node.type == "Convolution" and "cuda" not in node.weights:
            return "its weights were not packed for CUDA"
        if node.type in ROUTING_OPS:
            return ("no MoE routing kernels on CUDA yet: the router's ops and ExpertAdd run on the CPU backup, "
                    "one round trip through the host per MoE layer and step")
        return super().decline(node, inputs, outputs)

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
            self.kv_caches[layer] = DeviceKVCache(self.device, self.storage.dtype, kv_heads, head_dim,
                                                  self.max_tokens + PREFILL_LEN)
        return self.kv_caches[layer]

    def set_kv_length(self, length: int) -> None:
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
    def storage_dtype(self, tensor: Tensor) -> np.dtype:
        return self.storage.dtype if np.dtype(tensor.dtype) == FLOAT else np.dtype(tensor.dtype)

    def itemsize(self, tensor: Tensor) -> int:
        return self.storage_dtype(tensor).itemsize

    def alloc(self, tensor: Tensor) -> None:
        """Arrays are made on first use (`buffer`), so a view can take its input's instead."""

    def buffer(self, tensor: Tensor):
        if tensor.device is None:
            tensor.device = self.device.empty(tensor.size, self.storage_dtype(tensor))
        return tensor.device

    def or_placeholder(self, array):
        return self.placeholder if array is None else array

    def scratch(self, name: str, size: int, dtype) -> object:
        """A flat array of at least `size` elements shared by the uncaptured (prefill) launches."""
        current = self._scratch.get(name)
        if current is None or current.size < size or current.dtype != np.dtype(dtype):
            current = self.device.empty(size, dtype)
            self._scratch[name] = current
        return current

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        self.graphs.host_transfer()
        values = np.asarray(array).reshape(-1)
        data = self.storage.to_storage(values) if np.dtype(tensor.dtype) == FLOAT else values.astype(tensor.dtype)
        target = self.buffer(tensor)
        if data.size:
            with self.device.stream:
                target[: data.size].set(np.ascontiguousarray(data), stream=self.device.stream)

    def download(self, tensor: Tensor) -> np.ndarray:
        self.graphs.host_transfer()
        with self.device.stream:
            stored = self.buffer(tensor)[: tensor.size].get(stream=self.device.stream)
        values = self.storage.from_storage(stored) if np.dtype(tensor.dtype) == FLOAT else stored
        return np.asarray(values).reshape(tensor.shape)

    def finish(self) -> None:
        self.graphs.flush()
        self.device.synchronize()
