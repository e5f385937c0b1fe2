"""BinaryOp, UnaryOp and Cast on float tensors, one kernel per op type (shaders/opencl/elementwise.cl)."""

from __future__ import annotations

import numpy as np

from mnngpu.backend.movement import broadcast_strides, coalesce
from mnngpu.backends.opencl.ops.base import MAX_RANK, OpenCLExecution, int8_vector
from mnngpu.errors import ModelFormatError
from mnngpu.ops.elementwise import BINARY_CODES, UNARY_CODES

# The op types elementwise.cl has a kernel for (binary_flat_<op>, unary_<op>).
BINARY_OPS = frozenset(BINARY_CODES)   # the kernels are named after the ops
UNARY_OPS = frozenset(UNARY_CODES)
FLOAT, INT = np.dtype(np.float32), np.dtype(np.int32)


def _dtypes(inputs, outputs) -> set[np.dtype]:
    return {np.dtype(t.dtype) for t in (*inputs, *outputs)}


def _decline_float_kernel(node, inputs, outputs, kernels: frozenset[str]) -> str | None:
    if node.param.opType not in kernels:
        return f"no {node.type} kernel for {node.param.opType}"
    dtypes = _dtypes(inputs, outputs)
    if dtypes == {FLOAT}:
        return None
    return f"{node.type} kernels run on float32 tensors, got {sorted(d.name for d in dtypes)}"


class OpenCLBinary(OpenCLExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        return _decline_float_kernel(node, inputs, outputs, BINARY_OPS)

    def plan(self, inputs, outputs):
        a, b, out = inputs[0], inputs[1], outputs[0]
        op = self.node.param.opType
        buffers = [out, a, b, np.int32(out.size)]
        if a.shape == b.shape == out.shape:
            self.prepare("elementwise.cl", f"binary_flat_{op}", buffers, (out.size,))
            return
        shape, (a_strides, b_strides) = coalesce(out.shape, broadcast_strides(a.shape, out.shape),
                                                 broadcast_strides(b.shape, out.shape))
        if len(shape) > MAX_RANK:
            raise ModelFormatError(f"a broadcast over at most {MAX_RANK} dims, got {len(shape)}", field=self.node.name)
        vectors = [int8_vector(shape, 1), int8_vector(a_strides, 0), int8_vector(b_strides, 0)]
        self.prepare("elementwise.cl", f"binary_strided_{op}", buffers + vectors, (out.size,),
                     defines={"RANK": len(shape)})


class OpenCLUnary(OpenCLExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        return _decline_float_kernel(node, inputs, outputs, UNARY_OPS)

    def plan(self, inputs, outputs):
        out = outputs[0]
        args = [out, inputs[0], np.int32(out.size)]
        self.prepare("elementwise.cl", f"unary_{self.node.param.opType}", args, (out.size,))


class OpenCLCast(OpenCLExecution):
    """int32 <-> float32; a cast to the same type is a view."""

    @classmethod
    def decline(cls, inputs, outputs, node):
        dtypes = _dtypes(inputs, outputs)
        if dtypes <= {FLOAT, INT}:
            return None
        return f"Cast kernels convert float32 and int32, got {sorted(d.name for d in dtypes)}"

    def plan(self, inputs, outputs):
        x, out = inputs[0], outputs[0]
        if np.dtype(x.dtype) == np.dtype(out.dtype):
            self.view_of = 0
            return
        name = "cast_int_to_float" if np.issubdtype(out.dtype, np.floating) else "cast_float_to_int"
        self.prepare("elementwise.cl", name, [out, x, np.int32(out.size)], (out.size,))


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"BinaryOp": OpenCLBinary, "UnaryOp": OpenCLUnary, "Cast": OpenCLCast}
