"""The CUDA backend: the whole graph on one NVIDIA GPU through cupy, kernels from shaders/cuda.

Fixed-shape (MNN's shapeMutable=false): each pool module is resized once, its launches are
prepared then, and every step replays them; the decode module's launches are captured once
into a CUDA graph and replayed per token (graph.py). The KV cache lives on the device; per
step only the graph inputs and the KV places (the step buffer or the rows table) go up and the
logits come down.

Several sequences (continuous batching), as on Vulkan: each layer's KV cache is one array per side
with a region per sequence (ops/attention.py KVPool), so the launches prepared once, and the graph
capturing them, serve every sequence. A sequence takes a slot at its first forward and gives it
back when dropped; more sequences than slots grow every pool before a run's first launch, and the
launches are prepared and captured again over the new arrays. A batched decode forward (a module of
a fixed number of rows) places each row from the rows table; the rows no sequence holds are idle.

A tensor's `device` is a flat cupy array of its storage dtype (memory.py: fp32 at precision
high, else fp16 or bf16; int32 stays int32), made on first use (`_buffer`), so views can share
their input's array instead. The op table is ops/__init__.py; what its Executions share is
ops/base.py.
"""

from __future__ import annotations

import dataclasses
import weakref

import numpy as np

from mnngpu.backend import Backend, BackendConfig, Capabilities, Tensor
from mnngpu.backend.device_caches import PooledKVCaches
from mnngpu.backend.kv import KVMeta
from mnngpu.backend.sequences import segments
from mnngpu.backends.cuda.device import CudaDevice, log
from mnngpu.backends.cuda.graph import GraphRecorder, Recording
from mnngpu.backends.cuda.memory import Storage, storage_for
from mnngpu.backends.cuda.ops import EXECUTIONS
from mnngpu.backends.cuda.ops.attention import CUDAAttention, DeviceKVCache, KVPool
from mnngpu.errors import ConfigError, ModelFormatError
from mnngpu.ops.linear_attention import NO_DEVICE_KERNEL
from mnngpu.ops.routing import ROUTING_OPS

FLOAT = np.dtype(np.float32)
ROWS_TABLE_ROWS = 256   # rows a batched forward may place (the rows table's size)
NO_ROUTING = ("no MoE routing kernels on CUDA yet: the router's ops and ExpertAdd run on the CPU backup, "
              "one round trip through the host per MoE layer and step")


class CUDABackend(PooledKVCaches, Backend):
    pooled_cache = DeviceKVCache   # a sequence's region of a layer's pool (backend.device_caches.PooledKVCaches)
    type = "cuda"
    caps = Capabilities(fixed_shape=True, batched=True,
                        declines={**{op: NO_ROUTING for op in ROUTING_OPS}, "LinearAttention": NO_DEVICE_KERNEL})
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
        self.step = self.device.empty(2, np.int32)   # a one-sequence forward's kept KV length and slot
        self.rows_table_rows = ROWS_TABLE_ROWS       # a batched forward's (slot, position) per row
        self.rows_table = self.device.empty(2 * ROWS_TABLE_ROWS, np.int32)
        self._written: dict[str, bytes] = {}         # what step and rows_table hold now
        self.kv_pools: dict[int, KVPool] = {}        # layer index -> every sequence's keys and values
        self._start_slots()
        self._attention_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # recording -> its Attention ops
        self.placeholder = self.device.empty(1, np.float32)  # bound where a kernel's optional buffer is absent
        self._scratch_arrays: dict[str, object] = {}
        self.description = f"cuda on {self.device.name}"
        log.info("CUDA on %s (compute %s), %s storage", self.device.name, self.device.compute_capability,
                 self.storage.name)

    # ---- resize ---------------------------------------------------------------------------------
    def onResizeBegin(self) -> None:
        self.graphs.begin_resize()

    def onResizeEnd(self) -> None:
        self.graphs.end_resize()

    # ---- the KV cache ---------------------------------------------------------------------------
    def _kv_pool(self, layer: int, kv_heads: int, head_dim: int) -> KVPool:
        """Layer `layer`'s keys and values of every sequence, made when absent."""
        pool = self.kv_pools.get(layer)
        if pool is None:
            capacity = self.max_tokens + self.config.prefill_len
            pool = self.kv_pools[layer] = KVPool(self.device, self.storage, kv_heads, head_dim, capacity, self.slots)
        elif (pool.kv_heads, pool.head_dim) != (kv_heads, head_dim):
            raise ModelFormatError(f"layer {layer}'s Attention ops disagree on kv heads / head dim",
                                   field="Attention.layer_index")
        return pool

    def _grow_slots(self, needed: int) -> None:
        """Room for `needed` sequences in every pool (doubling); the graphs are captured again."""
        slots = max(needed, 2 * self.slots)
        try:
            for pool in self.kv_pools.values():
                pool.grow(slots=slots)
        except MemoryError as exc:   # cupy's OutOfMemoryError
            capacity = max((pool.capacity for pool in self.kv_pools.values()), default=0)
            raise ConfigError(f"{slots} sequences' KV caches of {capacity} tokens each do not fit in the memory of "
                              f"{self.device.name} ({exc}); run fewer sequences at once (--parallel) or lower "
                              "max_all_tokens", field="parallel") from exc
        finally:
            self.graphs.invalidate()   # some pools may have grown before one failed
        self.slots = slots

    def _room_for(self, tokens: int) -> None:
        """Room for `tokens` tokens in every slot of every pool (backend.kv.grown_capacity)."""
        grown = [pool.grow(tokens=tokens) for pool in self.kv_pools.values()]
        if any(grown):
            self.graphs.invalidate()

    def _set_step(self, past: int, slot: int) -> None:
        """A one-sequence forward: the tokens kept in front of this step's new ones, and its slot."""
        self._write("step", self.step, np.array([past, slot], dtype=np.int32))

    def _set_rows(self, places: np.ndarray) -> None:
        """A batched forward: each row's (slot, position), int32 (rows, 2)."""
        self._write("rows", self.rows_table, places)

    def _write(self, name: str, target, values: np.ndarray) -> None:
        """Copy `values` to the front of `target` on the stream, unless it holds them already (every
        Attention op of a forward writes the same)."""
        values = np.ascontiguousarray(values, dtype=np.int32).reshape(-1)
        if self._written.get(name) != values.tobytes():
            with self.device.stream:
                target[: values.size].set(values, stream=self.device.stream)
            self._written[name] = values.tobytes()

    def _prepare_run(self, recording: Recording) -> None:
        """Before a run's first launch (and before a graph is captured or replayed)."""
        attention = self._attention_of.get(recording)
        if attention is None:
            attention = [e for e in recording.executions if isinstance(e, CUDAAttention)]
            self._attention_of[recording] = attention
        if attention:
            self._make_room(attention)

    def _make_room(self, attention: list[CUDAAttention]) -> None:
        """Every sequence of the forward holds a slot, and room in every pool for its new rows, so
        that no array moves mid-run."""
        needed = 0
        for segment in segments(self, attention[0].seq):
            for execution in attention:
                execution.cache()   # the sequence's slot is taken at its first forward
            rows = attention[0].seq if segment is None else segment.rows
            needed = max(needed, self.kv_meta.kept + rows)
        self._room_for(needed)

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
