"""The CPU backend: numpy for data movement, numba kernels for the heavy ops.

A tensor's device buffer is a numpy array. Executions assign their output arrays, so
reshapes and slices stay views and nothing is copied that need not be.
"""

from __future__ import annotations

import os

import numba
import numpy as np

from mnngpu.backend import Backend, BackendConfig, Node, Tensor
from mnngpu.backends.cpu.ops.attention import CPUAttention
from mnngpu.backends.cpu.ops.elementwise import HostOpExecution
from mnngpu.backends.cpu.ops.matmul import CPULinear, pack_linear
from mnngpu.backends.cpu.ops.norm import CPULayerNorm
from mnngpu.runtime.host_ops import HOST_OPS


# OpenMP's spinning workers fight OpenBLAS's on small machines (a 128x128 GEMV took 12 ms
# instead of 0.1 ms on 2 cores); numba's own workqueue pool has no such contention.
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"


class CPUBackend(Backend):
    type = "cpu"
    fixed_shape = False
    executions = {**{op: HostOpExecution for op in HOST_OPS - {"Shape", "Rank", "Size"}},
                  "Convolution": CPULinear, "LayerNorm": CPULayerNorm, "Attention": CPUAttention}

    def __init__(self, config: BackendConfig, kv_meta=None):
        super().__init__(config, kv_meta)
        numba.set_num_threads(max(1, min(config.thread_num, numba.config.NUMBA_NUM_THREADS)))
        self.kv_caches: dict[int, object] = {}   # layer_index -> ops.attention.KVCache

    def rearrange(self, node: Node) -> None:
        if node.type == "Convolution":
            node.weights["packed"] = pack_linear(node.weights.pop("weight"))

    def alloc(self, tensor: Tensor) -> None:
        """Executions hand over their own result arrays; nothing to reserve up front."""

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        tensor.device = np.asarray(array, dtype=tensor.dtype).reshape(tensor.shape)

    def download(self, tensor: Tensor) -> np.ndarray:
        return np.asarray(tensor.device).reshape(tensor.shape)
