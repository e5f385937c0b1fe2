"""BinaryOp, UnaryOp and Cast on the device (shaders/cuda/elementwise.cu).

A broadcasting BinaryOp reads its inputs through index maps planned once on the host with
numpy's own broadcasting, so the semantics are numpy's by construction.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backends.cuda.device import BLOCK, grid_for
from mnngpu.backends.cuda.ops.base import CUDAExecution
from mnngpu.ops.common import DTYPES
from mnngpu.ops.elementwise import BINARY_CODES, UNARY_CODES

# Op codes of binary_op / unary_op in elementwise.cu.
FLOAT, INT = np.dtype(np.float32), np.dtype(np.int32)


def broadcast_index(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> np.ndarray:
    """For each output element, the flat index of the input element numpy broadcasting reads."""
    flat = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int32).reshape(shape)
    return np.ascontiguousarray(np.broadcast_to(flat, out_shape), dtype=np.int32).reshape(-1)


class CUDAElementwise(CUDAExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        if supported(node, inputs, outputs):
            return None
        return f"no {node.type} kernel for these dtypes or this op"


class CUDABinary(CUDAElementwise):
    def onResize(self, inputs, outputs):
        backend, out = self.backend, outputs[0]
        a, b = inputs
        code = np.int32(BINARY_CODES[self.node.param.opType])
        n = np.int32(out.size)
        buffers = (backend._buffer(a), backend._buffer(b))
        if tuple(a.shape) == tuple(out.shape) and tuple(b.shape) == tuple(out.shape):
            self.prepare("elementwise.cu", "binary_same", grid_for(n), (BLOCK,),
                         (code, n, *buffers, backend._buffer(out)))
            return
        self.maps = [backend.device.to_device(broadcast_index(t.shape, out.shape)) for t in inputs]
        self.prepare("elementwise.cu", "binary_indexed", grid_for(n), (BLOCK,),
                     (code, n, *buffers, *self.maps, backend._buffer(out)))


class CUDAUnary(CUDAElementwise):
    def onResize(self, inputs, outputs):
        n = np.int32(outputs[0].size)
        code = np.int32(UNARY_CODES[self.node.param.opType])
        self.prepare("elementwise.cu", "unary", grid_for(n), (BLOCK,),
                     (code, n, self.backend._buffer(inputs[0]), self.backend._buffer(outputs[0])))


class CUDACast(CUDAElementwise):
    """int32 <-> float; a cast to the same type shares its input's buffer."""

    def onResize(self, inputs, outputs):
        source, target = np.dtype(inputs[0].dtype), np.dtype(outputs[0].dtype)
        if source == target:
            outputs[0].device = self.backend._buffer(inputs[0])
            self.needs_run = False
            return
        kernel = "int_to_real" if source == INT else "real_to_int"
        n = np.int32(outputs[0].size)
        self.prepare("elementwise.cu", kernel, grid_for(n), (BLOCK,),
                     (n, self.backend._buffer(inputs[0]), self.backend._buffer(outputs[0])))


def supported(node, inputs, outputs) -> bool:
    """Whether the device kernels cover this elementwise node's op code and types."""
    dtypes = {np.dtype(t.dtype) for t in (*inputs, *outputs)}
    if node.type == "BinaryOp":
        return node.param.opType in BINARY_CODES and dtypes == {FLOAT} and len(inputs) == 2
    if node.type == "UnaryOp":
        return node.param.opType in UNARY_CODES and dtypes == {FLOAT}
    if node.type == "Cast":
        return dtypes <= {FLOAT, INT} and DTYPES.get(node.param.dstT, FLOAT) in (np.float32, np.int32)
    return True


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"BinaryOp": CUDABinary, "UnaryOp": CUDAUnary, "Cast": CUDACast}
