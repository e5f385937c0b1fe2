"""The OpenCL backend: the whole graph on one OpenCL device, kernels from shaders/opencl.

Fixed-shape (MNN's shapeMutable=false): each pool module is resized once, its kernels get
their buffers and shapes bound then, and every step replays the same kernel list. The KV
cache lives on the device; per step only the graph inputs go up and the logits come down.

A tensor's `device` is a pyopencl Buffer, planned at the end of each resize (memory.py):
activations share a pool by lifetime, and views share their input's buffer. Float tensors are
stored as fp32, or as fp16 under precision low/normal where the device has cl_khr_fp16; int32
tensors as int32.
"""

from __future__ import annotations

import os
from typing import ClassVar

import numpy as np
import pyopencl as cl

from mnngpu.backend import Backend, BackendConfig, Node, Tensor, warn_once
from mnngpu.backends.opencl import memory
from mnngpu.backends.opencl.device import VARIANTS, log, shared_device
from mnngpu.backends.opencl.memory import RecordedStep
from mnngpu.backends.opencl.ops.attention import DeviceKVCache, attention_execution
from mnngpu.backends.opencl.ops.elementwise import (
    BINARY_OPS,
    UNARY_OPS,
    BinaryExecution,
    CastExecution,
    UnaryExecution,
)
from mnngpu.backends.opencl.ops.matmul import LinearExecution, pack_linear
from mnngpu.backends.opencl.ops.movement import ConcatExecution, GatherCopyExecution, ViewExecution
from mnngpu.backends.opencl.ops.norm import LayerNormExecution, pack_norm
from mnngpu.backends.opencl.ops.rope import RoPEExecution
from mnngpu.backends.opencl.ops.routing import (
    ExpertAddExecution,
    ReductionExecution,
    SoftmaxExecution,
    TopKExecution,
)
from mnngpu.errors import ConfigError
from mnngpu.runtime import routing
from mnngpu.runtime.module_pool import PREFILL_LEN
from mnngpu.runtime.op_table import EXPERT_ADD, ROPE

FLOAT, INT = np.dtype(np.float32), np.dtype(np.int32)
DEFAULT_MAX_TOKENS = 2048
VIEW_OPS = ("Reshape", "Squeeze", "Unsqueeze", "ConvertTensor", "Identity")


class OpenCLBackend(Backend):
    type = "opencl"
    fixed_shape = True
    encoder_attention = True
    executions: ClassVar[dict] = {**{op: ViewExecution for op in VIEW_OPS},
                  "StridedSlice": GatherCopyExecution, "GatherV2": GatherCopyExecution, "Gather": GatherCopyExecution,
                  "Concat": ConcatExecution, "BinaryOp": BinaryExecution, "UnaryOp": UnaryExecution,
                  "Cast": CastExecution, "LayerNorm": LayerNormExecution, "Convolution": LinearExecution,
                  "Attention": attention_execution, ROPE: RoPEExecution,
                  "Softmax": SoftmaxExecution, "TopKV2": TopKExecution, "Reduction": ReductionExecution,
                  EXPERT_ADD: ExpertAddExecution}

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
        # KV capacity (+ one prefill chunk of padding): MNN's max_all_tokens, once BackendConfig carries it
        self.max_tokens = int(getattr(config, "max_all_tokens", None) or DEFAULT_MAX_TOKENS)
        self.kv_caches: dict[int, DeviceKVCache] = {}
        self.kv_length_buffer = self.device.buffer(4)
        self.placeholder = self.device.buffer(4)  # bound where a kernel's optional buffer is absent
        self._kv_length: int | None = None
        self._in_flight: list[np.ndarray] = []   # host arrays of non-blocking uploads, kept until finish()
        self.pool = memory.BufferPool(self.device.buffer)   # activations, shared by the pipelines
        self._recorded: list[RecordedStep] | None = None
        self._pinned: set[int] = set()           # id()s of tensors another backend copies out
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

    def describe(self) -> str:
        return f"opencl on {self.device.name} ({'CPU' if self.device.is_cpu else 'GPU'})"

    # ---- ops ----------------------------------------------------------------------------------
    def decline(self, node: Node, inputs: list[Tensor], outputs: list[Tensor]) -> str | None:
        op = node.type
        dtypes = {np.dtype(t.dtype) for t in (*inputs, *outputs)}
        names = sorted(d.name for d in dtypes)
        if op in ("BinaryOp", "UnaryOp"):
            kernels = BINARY_OPS if op == "BinaryOp" else UNARY_OPS
            if node.param.opType not in kernels:
                return f"no {op} kernel for {node.param.opType}"
            return None if dtypes == {FLOAT} else f"{op} kernels run on float32 tensors, got {names}"
        if op == "Cast" and not dtypes <= {FLOAT, INT}:
            return f"Cast kernels convert float32 and int32, got {names}"
        if op in ("StridedSlice", "GatherV2", "Gather") and any(t.host is None for t in inputs[1:]):
            return "indices computed on the device"
        if op in routing.ROUTING_OPS:
            return routing.decline(node, inputs)
        return super().decline(node, inputs, outputs)

    def declined(self, node: Node, inputs: list[Tensor]) -> None:
        self._pinned.update(id(t) for t in inputs)  # the CPU backup will copy them out

    def rearrange(self, node: Node) -> None:
        if node.type == "Convolution":
            node.weights["opencl"] = pack_linear(self, node.weights.pop("weight"))
        elif node.type == "LayerNorm":
            pack_norm(self, node)

    def kernel(self, source: str, name: str, defines: dict) -> cl.Kernel:
        """A new instance (its own bound arguments) of kernel `name` of shaders/opencl/<source>."""
        storage = {"HALF_STORAGE": 1} if self.half else {}
        if self.half and self.device.has_fp16:
            storage["HAS_FP16_EXTENSION"] = 1
        return cl.Kernel(self.device.program(source, {**storage, **defines}), name)

    # ---- the KV cache ---------------------------------------------------------------------------
    kv_int8 = True   # attention_mode 1 and 2 (ops/attention.py)
    kv_transfer = True   # the prefix cache (Backend.read_kv / write_kv over these caches)

    def kv_cache(self, layer: int, kv_heads: int, head_dim: int) -> DeviceKVCache:
        if layer not in self.kv_caches:
            int8 = (self.config.kv_quant >= 1, self.config.kv_quant == 2)
            self.kv_caches[layer] = DeviceKVCache(self, kv_heads, head_dim, self.max_tokens + PREFILL_LEN, int8)
        return self.kv_caches[layer]

    def set_kv_length(self, length: int) -> None:
        """Tokens kept in front of this step's new ones, for every Attention kernel to read."""
        if length != self._kv_length:
            self._write(self.kv_length_buffer, np.array([length], dtype=np.int32))
            self._kv_length = length

    # ---- resize: record, then plan the buffers and bind ---------------------------------------
    def onResizeBegin(self) -> None:
        self._recorded = []

    def record(self, execution, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        """An execution planned at onResize; bound once every tensor has its buffer."""
        step = RecordedStep(execution, inputs, outputs)
        if self.config.keep_tensors:
            self._pinned.update(id(t) for t in outputs)
        if self._recorded is None:  # resized on its own, outside a Pipeline's resize
            memory.plan([step], self.pool, self.nbytes, self._own_buffer, self._pinned)
        else:
            self._recorded.append(step)

    def onResizeEnd(self) -> None:
        memory.plan(self._recorded, self.pool, self.nbytes, self._own_buffer, self._pinned)
        self._recorded = None

    # ---- memory -----------------------------------------------------------------------------------
    def itemsize_of(self, dtype) -> int:
        return self.float_storage.itemsize if np.dtype(dtype) == FLOAT else np.dtype(dtype).itemsize

    def itemsize(self, tensor: Tensor) -> int:
        return self.itemsize_of(tensor.dtype)

    def storage_dtype(self, tensor: Tensor) -> np.dtype:
        return self.float_storage if np.dtype(tensor.dtype) == FLOAT else np.dtype(tensor.dtype)

    def nbytes(self, tensor: Tensor) -> int:
        return tensor.size * self.itemsize(tensor)

    def alloc(self, tensor: Tensor) -> None:
        """Buffers are planned together at onResizeEnd (memory.py); nothing to reserve one by one."""

    def _own_buffer(self, tensor: Tensor) -> cl.Buffer:
        return self.device.buffer(self.nbytes(tensor))

    def buffer(self, tensor: Tensor) -> cl.Buffer:
        """The tensor's buffer; one of its own when it has none yet (a graph input, a constant)."""
        if tensor.device is None:
            tensor.device = self._own_buffer(tensor)
        return tensor.device

    def or_placeholder(self, buffer: cl.Buffer | None) -> cl.Buffer:
        return self.placeholder if buffer is None else buffer

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        data = np.ascontiguousarray(np.asarray(array).reshape(tensor.shape), dtype=self.storage_dtype(tensor))
        self._write(self.buffer(tensor), data)

    def _write(self, buffer: cl.Buffer, data: np.ndarray) -> None:
        if data.nbytes:
            cl.enqueue_copy(self.queue, buffer, data, is_blocking=False)
            self._in_flight.append(data)

    def download(self, tensor: Tensor) -> np.ndarray:
        host = np.empty(tensor.shape, dtype=self.storage_dtype(tensor))
        if host.nbytes:
            cl.enqueue_copy(self.queue, host, self.buffer(tensor), is_blocking=True)
        self._in_flight.clear()  # the queue is in order: every earlier upload is done
        return host.astype(tensor.dtype, copy=False)

    def finish(self) -> None:
        self.queue.finish()
        self._in_flight.clear()
