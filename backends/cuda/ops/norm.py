"""LayerNorm / RMSNorm over the last len(param.axis) axes (shaders/cuda/norm.cu)."""

from __future__ import annotations

import numpy as np

from mnngpu.backends.cuda.device import BLOCK, grid_for
from mnngpu.backends.cuda.ops.base import CUDAExecution
from mnngpu.ops import norm
from mnngpu.ops.elementwise import BINARY_CODES


def norm_threads(cols: int) -> int:
    """Threads per row: a multiple of 32 up to 256."""
    return min(256, max(32, -(-cols // 32) * 32))


class CUDALayerNorm(CUDAExecution):
    @classmethod
    def pack(cls, backend, node):
        node.weights["cuda"] = norm.device_weights(node, backend.device.to_device)

    @classmethod
    def decline(cls, inputs, outputs, node):
        return norm.decline(inputs, outputs, node)

    def onResize(self, inputs, outputs):
        p, backend = self.node.param, self.backend
        cols = norm.norm_width(p, outputs[-1].shape)
        rows = inputs[0].size // max(1, cols)
        gamma, beta = self.node.weights["cuda"]
        x = inputs[0]
        if len(inputs) > 1:   # the residual sum first, into output 0; its norm goes to output 1
            n = np.int32(x.size)
            self.prepare("elementwise.cu", "binary_same", grid_for(n), (BLOCK,),
                         (np.int32(BINARY_CODES["ADD"]), n, backend._buffer(x), backend._buffer(inputs[1]),
                          backend._buffer(outputs[0])))
            x = outputs[0]
        args = (np.int32(cols), np.int32(bool(p.useRMSNorm)), np.float32(p.epsilon),
                backend._buffer(x), backend._or_placeholder(gamma), np.int32(gamma is not None),
                backend._or_placeholder(beta), np.int32(beta is not None), backend._buffer(outputs[-1]))
        self.prepare("norm.cu", "layer_norm", (max(1, rows),), (norm_threads(cols),), args)


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"LayerNorm": CUDALayerNorm}
