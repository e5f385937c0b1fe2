"""Elementwise ops: UnaryOp, BinaryOp (numpy broadcasting) and Cast."""

from __future__ import annotations

import numpy as np

from mnngpu.backend.movement import broadcast_strides, coalesce
from mnngpu.backends.vulkan.ops.base import VulkanExecution, element_groups, padded
from mnngpu.backends.vulkan.program import pack_push
from mnngpu.ops.elementwise import BINARY_CODES, UNARY_CODES


def _is_float(tensor) -> bool:
    return np.dtype(tensor.dtype).kind == "f"


class VulkanUnary(VulkanExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        if node.param.opType not in UNARY_CODES:
            return f"no unary kernel for {node.param.opType}"
        return None if _is_float(inputs[0]) else f"unary ops run on float tensors, got {inputs[0].dtype}"

    def onResize(self, inputs, outputs):
        x = inputs[0].device
        y = outputs[0].device = self.backend._new_tensor(outputs[0])
        n = outputs[0].size
        self.dispatch("unary", [x, y],
                      pack_push("II", n, UNARY_CODES[self.node.param.opType]), element_groups(n))


class VulkanBinary(VulkanExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        if node.param.opType not in BINARY_CODES:
            return f"no binary kernel for {node.param.opType}"
        if inputs[0].dtype != inputs[1].dtype:
            return f"mixed input dtypes {inputs[0].dtype} and {inputs[1].dtype}"
        return None

    def onResize(self, inputs, outputs):
        a, b = inputs[0].device, inputs[1].device
        kernel = "binary_f32" if _is_float(inputs[0]) else "binary_i32"
        out = outputs[0]
        c = out.device = self.backend._new_tensor(out)
        shape, (sa, sb) = coalesce(out.shape, broadcast_strides(inputs[0].shape, out.shape),
                                   broadcast_strides(inputs[1].shape, out.shape))
        what = f"BinaryOp {self.node.name}"
        push = pack_push("IIII6I6i6i", out.size, BINARY_CODES[self.node.param.opType], len(shape), 0,
                         *padded(shape, what), *padded(sa, what), *padded(sb, what))
        self.dispatch(kernel, [a, b, c], push, element_groups(out.size))


class VulkanCast(VulkanExecution):
    """int32 <-> float; a cast within a kind is the identity and aliases its input."""

    def onResize(self, inputs, outputs):
        x, out = inputs[0], outputs[0]
        if _is_float(x) == _is_float(out):
            out.device = x.device
            return
        y = out.device = self.backend._new_tensor(out)
        kernel = "cast_to_float" if _is_float(out) else "cast_to_int"
        self.dispatch(kernel, [x.device, y], pack_push("I", out.size), element_groups(out.size))


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"BinaryOp": VulkanBinary, "UnaryOp": VulkanUnary, "Cast": VulkanCast}
