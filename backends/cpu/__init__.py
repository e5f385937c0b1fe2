"""The CPU backend: numba kernels for the heavy ops, numpy for the rest, buffers planned at resize.

A tensor's device buffer is a numpy array. At the end of each resize the backend lays every
activation into one arena by lifetime (memory.py) and binds each execution to its arrays
(execution.py), so a replayed step is one Python call into one kernel.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numba
import numpy as np


def _user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mnngpu" / "numba"


# Compiled kernels are cached in the user's cache, never next to an installed (maybe read-only)
# package. Set before the kernel modules below are imported: numba picks the place then.
if not os.environ.get("NUMBA_CACHE_DIR"):
    numba.config.CACHE_DIR = str(_user_cache_dir())

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
from mnngpu.backends.cpu.ops.attention import CPUAttention  # noqa: E402
from mnngpu.backends.cpu.ops.elementwise import BinaryExecution, HostOpExecution, UnaryExecution  # noqa: E402
from mnngpu.backends.cpu.ops.matmul import CPUGatedLinear, CPULinear, pack_linear  # noqa: E402
from mnngpu.backends.cpu.ops.norm import CPULayerNorm  # noqa: E402
from mnngpu.backends.cpu.ops.rope import CPURoPE  # noqa: E402
from mnngpu.backends.cpu.threads import WorkerPool, launch_is_cheap, set_blas_threads  # noqa: E402
from mnngpu.runtime.op_table import GATED_LINEAR, LINEAR_GROUP, OPS, ROPE  # noqa: E402

VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "ConvertTensor", "Identity"})


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
        self.workers = WorkerPool.shared(threads)
        self.cheap_launches = launch_is_cheap()   # else only big GEMVs are split over the threads
        self.quantize_activations = config.precision == "low"   # decode GEMV on int16 x (ops/linear_kernels.py)
        self.kv_caches: dict[int, object] = {}   # layer_index -> ops.attention.KVCache
        self._recorded: list = []
        self._scratch: dict[tuple[str, int], np.ndarray] = {}

    # ---- load ----------------------------------------------------------------------------------
    def rearrange(self, node: Node) -> None:
        if node.type == "Convolution":
            node.weights["packed"] = pack_linear(node.weights.pop("weight"), node.param)

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
        """A copy: the buffer is reused by the next run."""
        return np.array(tensor.device, dtype=tensor.dtype).reshape(tensor.shape)

    # ---- what executions share -----------------------------------------------------------------
    def scratch(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A float32 work array of `shape`, this thread's own, reused (and grown) across calls."""
        key = (name, threading.get_ident())
        size = int(np.prod(shape))
        buffer = self._scratch.get(key)
        if buffer is None or buffer.size < size:
            buffer = self._scratch[key] = np.empty(size, dtype=np.float32)
        return buffer[:size].reshape(shape)

    def parallel(self, fn, count: int) -> None:
        """fn(0..count-1) spread over the backend's threads (prefill tiles)."""
        self.workers.parallel(fn, count)
