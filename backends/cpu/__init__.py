"""The CPU backend: numba kernels for the heavy ops, numpy for the rest, buffers planned at resize.

A tensor's device buffer is a numpy array. At the end of each resize the backend lays every
activation into one arena by lifetime (memory.py) and binds each execution to its arrays
(ops/base.py), so a replayed step is one Python call into one kernel. The op table is
ops/__init__.py; the device is the thread pool (device.py); the numba kernels that several ops
share are in kernels/.
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

GOMP_SPIN_ROUNDS = 10_000

# A decode step launches ~100 parallel kernels: OpenMP's spin-waiting team starts one in ~2 us,
# numba's workqueue pool in ~140 us (measured on 2 cores), which cost a third of each token.
# OpenMP's spinning fought OpenBLAS's own spinning workers, so BLAS runs one thread per caller
# (set_blas_threads below) and the prefill splits its GEMMs over a pool of Python threads.
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]
    numba.config.THREADING_LAYER = "default"
# libgomp's workers spin 300,000 rounds (milliseconds) after each parallel loop before they sleep: through
# a prefill's attention, which runs its BLAS on the Python threads, they held a core and the attention
# took 1.6x as long. 10,000 rounds still outlast the microseconds between a decode step's kernels.
# libgomp reads this when numba first loads it, after this import; a user's own setting is kept.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", str(GOMP_SPIN_ROUNDS))

from mnngpu.backend import Backend, BackendConfig, Capabilities, Tensor  # noqa: E402
from mnngpu.backend.kv import HostStateCache  # noqa: E402
from mnngpu.backend.planned import PlannedExecution, Recording  # noqa: E402
from mnngpu.backends.cpu import memory  # noqa: E402
from mnngpu.backends.cpu.device import WorkerPool, launch_is_cheap, set_blas_threads  # noqa: E402
from mnngpu.backends.cpu.ops import EXECUTIONS  # noqa: E402
from mnngpu.backends.cpu.ops.attention import KVCache  # noqa: E402
from mnngpu.backends.cpu.ops.norm import fold_norms  # noqa: E402

# Results up to this size are copied into an earlier download's array of the same shape once the
# caller has let go of it (a decode step's logits); the last few such arrays are kept.
RECYCLED_DOWNLOAD_BYTES = 4 << 20
RECYCLED_DOWNLOADS = 4


class CPUBackend(Backend):
    type = "cpu"
    # kv_transfer: backend.sequences.read_kv / write_kv over these caches (the prefix cache)
    caps = Capabilities(encoder_attention=True, windowed_convolution=True, kv_int8=True, kv_transfer=True,
                        host_weights=True, batched=True, batched_state=True)
    executions = EXECUTIONS

    def __init__(self, config: BackendConfig, kv_meta=None):
        super().__init__(config, kv_meta)
        threads = max(1, min(config.thread_num, numba.config.NUMBA_NUM_THREADS))
        numba.set_num_threads(threads)
        set_blas_threads(1)
        memory.fix_mmap_threshold()
        self.workers = WorkerPool.shared(threads)
        self.cheap_launches = launch_is_cheap()   # else only big GEMVs are split over the threads
        self.quantize_activations = config.precision == "low"   # int4 linears on int16 x (kernels/lane_kernels.py)
        self.lane_layers = 0   # int4 layers packed into lane groups (int8_activations needs one)
        # kvcache_mmap / use_mmap: those arrays live in files under tmp_path
        self.kv_files = memory.MappedFiles(config.tmp_path, "kv") if config.kvcache_mmap else None
        self.weight_files = memory.MappedFiles(config.tmp_path, "weight") if config.use_mmap else None
        self.recording = Recording(self._plan_buffers)
        self._scratch_arrays: dict[tuple[str, int, str], np.ndarray] = {}
        self._downloads: dict[tuple, np.ndarray] = {}   # (shape, dtype) -> a download's array, oldest first

    # ---- load: each Execution packs its own weights (Execution.pack) -------------------------
    def _mapped(self, packed):
        """use_mmap: each array the packing made in memory (not a view of the weight file) moves
        to a file under tmp_path."""
        moved = {name: self.weight_files.copy(array) for name in ("codes", "alpha", "bias", "dense")
                 if memory.owns_memory(array := getattr(packed, name))}
        return dataclasses.replace(packed, **moved)

    # ---- resize: record, then plan the buffers and bind ---------------------------------------
    def onResizeBegin(self) -> None:  # noqa: N802
        self.recording.begin()

    def onResizeEnd(self) -> None:  # noqa: N802
        fold_norms(self.recording.end())

    def _plan_buffers(self, executions: list[PlannedExecution]) -> None:
        steps = [memory.PlannedStep(e.inputs, e.outputs, e.view_of) for e in executions]
        memory.plan(steps, reuse=not self.config.keep_tensors)

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
    def _scratch(self, name: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """A work array of `shape`, this thread's own, reused (and grown) across calls."""
        key = (name, threading.get_ident(), np.dtype(dtype).str)
        size = math.prod(shape)
        buffer = self._scratch_arrays.get(key)
        if buffer is None or buffer.size < size:
            buffer = self._scratch_arrays[key] = np.empty(size, dtype=dtype)
        return buffer[:size].reshape(shape)

    def _kv_zeros(self, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """A KV cache array: in a file under tmp_path with kvcache_mmap, else in memory."""
        if self.kv_files is not None:
            return self.kv_files.zeros(shape, dtype)
        return np.zeros(shape, dtype=dtype)

    # ---- the KV cache --------------------------------------------------------------------------
    def kv_cache(self, layer: int, kv_heads: int, head_dim: int) -> KVCache:
        """Layer `layer`'s cache, made empty when absent: int8 keys (and values) per kv_quant, in
        files with kvcache_mmap."""
        if layer not in self.kv_caches:
            self.kv_caches[layer] = KVCache(kv_heads, head_dim, zeros=self._kv_zeros,
                                            int8_keys=self.config.kv_quant >= 1, int8_values=self.config.kv_quant == 2)
        return self.kv_caches[layer]

    # ---- recurrent state (backend.kv.StateCache) ---------------------------------------------------
    def _state_cache(self, name: str, shapes: dict[str, tuple[int, ...]]) -> HostStateCache:
        """The state of the recurrent op `name`, made zero when absent (kept in `state_caches`; the
        prefix cache may have put it there, backend.sequences.write_states)."""
        if name not in self.state_caches:
            self.state_caches[name] = HostStateCache(shapes)
        return self.state_caches[name]

    def _parallel(self, fn, count: int) -> None:
        """fn(0..count-1) spread over the backend's threads (prefill tiles)."""
        self.workers.parallel(fn, count)
