"""The CPU backend: numba kernels for the heavy ops, numpy for the rest, buffers planned at resize.

A tensor's device buffer is a numpy array. At the end of each resize the backend lays every
activation into one arena by lifetime (memory.py) and binds each execution to its arrays
(execution.py), so a replayed step is one Python call into one kernel.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading

import numba
import numpy as np

from mnngpu import jit  # noqa: F401 -- first: it tells numba where the kernel cache is

# A decode step launches ~100 parallel kernels: OpenMP's spin-waiting team starts one in ~2 us,
# numba's workqueue pool in ~140 us (measured on 2 cores), which cost a third of each token.
# OpenMP's spinning fought OpenBLAS's own spinning workers, so BLAS runs one thread per caller
# (set_blas_threads below) and the prefill splits its GEMMs over a pool of Python threads.
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]
    numba.config.THREADING_LAYER = "default"

from mnngpu.backend import Backend, BackendConfig, Node, Tensor  # noqa: E402
from mnngpu.backends.cpu import memory  # noqa: E402
from mnngpu.backends.cpu.execution import ViewExecution  # noqa: E402
from mnngpu.backends.cpu.mapped_files import MappedFiles  # noqa: E402
from mnngpu.backends.cpu.ops.attention import CPUAttention, CPUEncoderAttention, KVCache  # noqa: E402
from mnngpu.backends.cpu.ops.elementwise import BinaryExecution, HostOpExecution, UnaryExecution  # noqa: E402
from mnngpu.backends.cpu.ops.matmul import CPUConvolution, CPUGatedLinear, CPULinear, pack_linear  # noqa: E402
from mnngpu.backends.cpu.ops.norm import CPULayerNorm  # noqa: E402
from mnngpu.backends.cpu.ops.rope import CPURoPE  # noqa: E402
from mnngpu.backends.cpu.threads import WorkerPool, launch_is_cheap, set_blas_threads  # noqa: E402
from mnngpu.runtime.host_ops import is_pointwise, is_windowed  # noqa: E402
from mnngpu.runtime.op_table import GATED_LINEAR, LINEAR_GROUP, OPS, ROPE  # noqa: E402

VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "ConvertTensor", "Identity"})
# Results up to this size are copied into an earlier download's array of the same shape once the
# caller has let go of it (a decode step's logits); the last few such arrays are kept.
RECYCLED_DOWNLOAD_BYTES = 4 << 20
RECYCLED_DOWNLOADS = 4
SMALL_WEIGHT_BYTES = 1 << 16   # weights up to this size are copied out of the weight file at load


def _owns_memory(array) -> bool:
    """A non-empty array whose bytes are its own or another in-memory array's (no file mapping)."""
    if not isinstance(array, np.ndarray) or array.size == 0:
        return False
    while isinstance(array, np.ndarray):
        if isinstance(array, np.memmap):
            return False
        array = array.base
    return array is None or isinstance(array, bytes | bytearray)


def _is_small_file_view(array) -> bool:
    return isinstance(array, np.ndarray) and 0 < array.nbytes <= SMALL_WEIGHT_BYTES and not _owns_memory(array)


class CPUBackend(Backend):
    type = "cpu"
    fixed_shape = False
    executions = {**{name: HostOpExecution for name, op in OPS.items() if op.host and not op.shape_only},
                  **{op: ViewExecution for op in VIEW_OPS},
                  "BinaryOp": BinaryExecution, "UnaryOp": UnaryExecution,
                  "Convolution": CPULinear, LINEAR_GROUP: CPULinear, GATED_LINEAR: CPUGatedLinear,
                  "LayerNorm": CPULayerNorm, "Attention": CPUAttention, ROPE: CPURoPE}

    # False when another backend reads this one's tensors between its steps (the CPU backup
    # of a device backend): then no two tensors share memory.
    reuse_memory = True

    def __init__(self, config: BackendConfig, kv_meta=None):
        super().__init__(config, kv_meta)
        threads = max(1, min(config.thread_num, numba.config.NUMBA_NUM_THREADS))
        numba.set_num_threads(threads)
        set_blas_threads(1)
        memory.fix_mmap_threshold()
        self.workers = WorkerPool.shared(threads)
        self.cheap_launches = launch_is_cheap()   # else only big GEMVs are split over the threads
        self.quantize_activations = config.precision == "low"   # int4 linears on int16 x (ops/lane_kernels.py)
        self.kv_caches: dict[int, object] = {}   # layer_index -> ops.attention.KVCache
        # kvcache_mmap / use_mmap: those arrays live in files under tmp_path
        self.kv_files = MappedFiles(config.tmp_path, "kv") if config.kvcache_mmap else None
        self.weight_files = MappedFiles(config.tmp_path, "weight") if config.use_mmap else None
        self._recorded: list = []
        self._scratch: dict[tuple[str, int, str], np.ndarray] = {}
        self._downloads: dict[tuple, np.ndarray] = {}   # (shape, dtype) -> a download's array, oldest first

    encoder_attention = True
    windowed_convolution = True

    def onCreate(self, inputs, outputs, node):  # noqa: N802
        if node.type == "Attention" and not node.param.kv_cache:
            return CPUEncoderAttention(self, node)
        if node.type == "Convolution" and is_windowed(node.param.common, inputs[0].shape):
            return CPUConvolution(self, node)
        return super().onCreate(inputs, outputs, node)

    # ---- load ----------------------------------------------------------------------------------
    def rearrange(self, node: Node) -> None:
        if node.type == "Convolution":
            lanes = self.quantize_activations and is_pointwise(node.param.common)
            packed = pack_linear(node.weights.pop("weight"), node.param, lanes=lanes)
            if self.weight_files is not None:
                packed = self._mapped(packed)
            node.weights["packed"] = packed
            return
        # A norm's gamma read from the weight file each step keeps the file's page under it
        # resident, and where the kernel maps the file in 2 MB pages that is 2 MB a norm (60 MB
        # for a 24-layer model); the repacked matrices no longer hold those pages.
        for name, array in node.weights.items():
            if _is_small_file_view(array):
                node.weights[name] = np.array(array)

    def _mapped(self, packed):
        """use_mmap: each array the packing made in memory (not a view of the weight file) moves
        to a file under tmp_path."""
        moved = {name: self.weight_files.copy(array) for name in ("codes", "alpha", "bias", "dense")
                 if _owns_memory(array := getattr(packed, name))}
        return dataclasses.replace(packed, **moved)

    # ---- resize: record, then plan the buffers and bind ---------------------------------------
    def onResizeBegin(self) -> None:  # noqa: N802
        self._recorded = []

    def record(self, execution) -> None:
        """Called by each CPU execution's onResize, in run order."""
        self._recorded.append(execution)

    def onResizeEnd(self) -> None:  # noqa: N802
        steps = [memory.PlannedStep(e.inputs, e.outputs, e.view_of) for e in self._recorded]
        memory.plan(steps, reuse=self.reuse_memory and not self.config.keep_tensors)
        for execution in self._recorded:
            execution.bind()
        self._recorded = []

    # ---- tensors -------------------------------------------------------------------------------
    def alloc(self, tensor: Tensor) -> None:
        """Buffers are planned together at onResizeEnd; nothing to reserve one by one."""

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        buffer = tensor.device
        if isinstance(buffer, np.ndarray) and buffer.flags.writeable and buffer.shape == tuple(tensor.shape):
            np.copyto(buffer, np.asarray(array).reshape(tensor.shape), casting="unsafe")
        else:
            tensor.device = np.array(array, dtype=tensor.dtype).reshape(tensor.shape)

    def download(self, tensor: Tensor) -> np.ndarray:
        """A copy: the buffer is reused by the next run.

        A fresh array for each decode step's 600 KB of logits cost ~150 page faults (0.3 ms, 2%
        of the step), because the allocator hands freed blocks of that size back to the system.
        So a small result goes into an earlier download's array of its shape when no one holds
        that or a view of it any more (only this backend's reference is left)."""
        key = (tuple(tensor.shape), np.dtype(tensor.dtype).str)
        previous = self._downloads.get(key)
        if previous is not None and sys.getrefcount(previous) == 3:   # the dict, `previous`, the argument
            return self._copy_into(previous, tensor)
        copy = self._copy_into(np.empty(key[0], key[1]), tensor)   # owns its data: a view of it refers to it
        if copy.nbytes <= RECYCLED_DOWNLOAD_BYTES:
            self._downloads.pop(key, None)
            self._downloads[key] = copy
            while len(self._downloads) > RECYCLED_DOWNLOADS:
                del self._downloads[next(iter(self._downloads))]
        return copy

    @staticmethod
    def _copy_into(array: np.ndarray, tensor: Tensor) -> np.ndarray:
        np.copyto(array, np.asarray(tensor.device).reshape(array.shape), casting="unsafe")
        return array

    # ---- what executions share -----------------------------------------------------------------
    def scratch(self, name: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """A work array of `shape`, this thread's own, reused (and grown) across calls."""
        key = (name, threading.get_ident(), np.dtype(dtype).str)
        size = math.prod(shape)
        buffer = self._scratch.get(key)
        if buffer is None or buffer.size < size:
            buffer = self._scratch[key] = np.empty(size, dtype=dtype)
        return buffer[:size].reshape(shape)

    def kv_zeros(self, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """A KV cache array: in a file under tmp_path with kvcache_mmap, else in memory."""
        if self.kv_files is not None:
            return self.kv_files.zeros(shape, dtype)
        return np.zeros(shape, dtype=dtype)

    # ---- the prefix cache ----------------------------------------------------------------------
    kv_transfer = True   # Backend.read_kv / write_kv over these caches
    kv_int8 = True
    host_weights = True

    def kv_cache(self, layer: int, kv_heads: int, head_dim: int) -> KVCache:
        """Layer `layer`'s cache, made empty when absent: int8 keys (and values) per kv_quant, in
        files with kvcache_mmap."""
        if layer not in self.kv_caches:
            self.kv_caches[layer] = KVCache(kv_heads, head_dim, zeros=self.kv_zeros,
                                            int8_keys=self.config.kv_quant >= 1, int8_values=self.config.kv_quant == 2)
        return self.kv_caches[layer]

    def parallel(self, fn, count: int) -> None:
        """fn(0..count-1) spread over the backend's threads (prefill tiles)."""
        self.workers.parallel(fn, count)
