"""Data movement. The view ops (mnngpu.ops.movement.VIEW_OPS) alias their input. StridedSlice,
GatherV2 and Concat become strided copies, planned at resize from their host rules
(mnngpu/ops/movement.py) run on an array of element indices, then split into affine pieces."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mnngpu.backend.movement import affine_strides, coalesce, contiguous_strides
from mnngpu.backends.vulkan.ops.base import VulkanExecution, element_groups, padded
from mnngpu.backends.vulkan.program import pack_push
from mnngpu.ops import movement
from mnngpu.ops.movement import VIEW_OPS


@dataclass
class StridedCopy:
    """dst[dst_offset + sum(c * dst_strides)] = src[src_offset + sum(c * src_strides)] over `shape`."""

    shape: list[int]
    src_offset: int
    src_strides: list[int]
    dst_offset: int
    dst_strides: list[int]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def affine_copies(index: np.ndarray) -> list[StridedCopy]:
    """Strided copies that fill a contiguous output whose element e is source element index[e].

    A slice's index map is affine in the output coordinates (one copy); a gather's splits
    along its leading axes into affine pieces."""
    copies: list[StridedCopy] = []
    _split(np.asarray(index, dtype=np.int64), 0, copies)
    return copies


def _split(index: np.ndarray, dst_offset: int, copies: list[StridedCopy]) -> None:
    if index.size == 0:
        return
    fitted = affine_strides(index)
    if fitted is not None:
        src_offset, src_strides = fitted
        shape, (src, dst) = coalesce(index.shape, src_strides, contiguous_strides(index.shape))
        copies.append(StridedCopy(shape, src_offset, src, dst_offset, dst))
        return
    while index.shape[0] == 1:
        index = index[0]
    step = int(np.prod(index.shape[1:], dtype=np.int64))
    for i in range(index.shape[0]):
        _split(index[i], dst_offset + i * step, copies)


class VulkanView(VulkanExecution):
    def onResize(self, inputs, outputs):
        outputs[0].device = inputs[0].device


class VulkanCopy(VulkanExecution):
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
        dst = outputs[0].device = self.backend._new_tensor(outputs[0])
        index = np.arange(inputs[0].size, dtype=np.int64).reshape(inputs[0].shape)
        chosen = np.asarray(select(index))
        self.record_copies(src, dst, affine_copies(chosen.reshape(outputs[0].shape)))


def _host_inputs(inputs) -> list[np.ndarray]:
    return [t.host for t in inputs[1:]]


class VulkanStridedSlice(VulkanCopy):
    def onResize(self, inputs, outputs):
        self.record_index_map(inputs, outputs,
                              lambda index: movement.strided_slice(self.node, [index, *_host_inputs(inputs)]))


class VulkanGather(VulkanCopy):
    @classmethod
    def decline(cls, inputs, outputs, node):
        if all(t.host is not None for t in inputs[1:]):
            return None
        return "indices computed on the device"

    def onResize(self, inputs, outputs):
        self.record_index_map(inputs, outputs,
                              lambda index: movement.gather(self.node, [index, *_host_inputs(inputs)]))


class VulkanConcat(VulkanCopy):
    def onResize(self, inputs, outputs):
        out = outputs[0]
        dst = out.device = self.backend._new_tensor(out)
        axis = int(self.node.param.axis) % len(out.shape)
        out_strides = contiguous_strides(out.shape)
        start = 0
        for tensor in inputs:
            src = tensor.device
            shape, (src_strides, dst_strides) = coalesce(tensor.shape, contiguous_strides(tensor.shape), out_strides)
            self.record_copies(src, dst, [StridedCopy(shape, 0, src_strides, start * out_strides[axis], dst_strides)])
            start += tensor.shape[axis]


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"StridedSlice": VulkanStridedSlice, "GatherV2": VulkanGather, "Gather": VulkanGather,
              "Concat": VulkanConcat, **{op: VulkanView for op in VIEW_OPS}}
