"""Data movement. Reshape, Squeeze, Unsqueeze, ConvertTensor and Identity alias their input
(NC4HW4 is logically NCHW here). StridedSlice, GatherV2 and Concat become strided copies,
planned at resize from host_ops' own semantics run on an array of element indices."""

from __future__ import annotations

import numpy as np

from mnngpu.backends.vulkan.ops.base import VulkanExecution, element_groups
from mnngpu.backends.vulkan.ops.layout import StridedCopy, affine_copies, coalesce, contiguous_strides, padded
from mnngpu.backends.vulkan.program import pack_push
from mnngpu.runtime import host_ops


class VulkanView(VulkanExecution):
    def onResize(self, inputs, outputs):
        outputs[0].device = inputs[0].device


class CopyExecution(VulkanExecution):
    def record_copies(self, src, dst, copies: list[StridedCopy]) -> None:
        what = f"{self.node.type} {self.node.name}"
        for c in copies:
            if c.size == 0:
                continue
            push = pack_push("IIii6I6i6i", c.size, len(c.shape), c.src_offset, c.dst_offset,
                             *padded(c.shape, what), *padded(c.src_strides, what), *padded(c.dst_strides, what))
            self.dispatch("copy", [src, dst], push, element_groups(c.size))

    def record_index_map(self, inputs, outputs, select) -> None:
        """outputs[0] = select(element indices of inputs[0]), as strided copies."""
        src = inputs[0].device
        dst = outputs[0].device = self.backend.new_tensor(outputs[0])
        index = np.arange(inputs[0].size, dtype=np.int64).reshape(inputs[0].shape)
        chosen = np.asarray(select(index))
        self.record_copies(src, dst, affine_copies(chosen.reshape(outputs[0].shape)))


def _host_inputs(inputs) -> list[np.ndarray]:
    return [t.host for t in inputs[1:]]


class VulkanStridedSlice(CopyExecution):
    def onResize(self, inputs, outputs):
        self.record_index_map(inputs, outputs,
                              lambda index: host_ops.strided_slice(self.node, [index, *_host_inputs(inputs)]))


class VulkanGather(CopyExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        if all(t.host is not None for t in inputs[1:]):
            return None
        return "indices computed on the device"

    def onResize(self, inputs, outputs):
        self.record_index_map(inputs, outputs,
                              lambda index: host_ops.gather(self.node, [index, *_host_inputs(inputs)]))


class VulkanConcat(CopyExecution):
    def onResize(self, inputs, outputs):
        out = outputs[0]
        dst = out.device = self.backend.new_tensor(out)
        axis = int(self.node.param.axis) % len(out.shape)
        out_strides = contiguous_strides(out.shape)
        start = 0
        for tensor in inputs:
            src = tensor.device
            shape, (src_strides, dst_strides) = coalesce(tensor.shape, contiguous_strides(tensor.shape), out_strides)
            self.record_copies(src, dst, [StridedCopy(shape, 0, src_strides, start * out_strides[axis], dst_strides)])
            start += tensor.shape[axis]
