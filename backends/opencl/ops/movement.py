"""Data movement on the device: views that share a buffer, and strided copies.

The view ops (mnngpu.ops.movement.VIEW_OPS) change no values, so their output is the input's
buffer and costs nothing per step. StridedSlice, GatherV2 and Concat copy, planned by
mnngpu.backend.movement from their host rules, so their semantics are written once, in
mnngpu/ops/movement.py.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend import Tensor
from mnngpu.backend.movement import (
    affine_strides,
    coalesce,
    concat_destinations,
    gather_sources,
    index_stand_in,
)
from mnngpu.backends.opencl.ops.base import MAX_RANK, OpenCLExecution, int8_vector
from mnngpu.ops.movement import VIEW_OPS


class OpenCLView(OpenCLExecution):
    view_of = 0


class OpenCLCopy(OpenCLExecution):
    def copy(self, dst: Tensor, src: Tensor, src_offsets: np.ndarray, dst_offsets: np.ndarray) -> None:
        """dst[dst_offsets[i]] = src[src_offsets[i]] over the elements i of one copy shape."""
        if src_offsets.size == 0:
            return
        width = "u16" if self.backend._itemsize(src) == 2 else "u32"
        src_fit, dst_fit = affine_strides(src_offsets), affine_strides(dst_offsets)
        n = np.int32(src_offsets.size)
        if src_fit is not None and dst_fit is not None:
            shape, (src_strides, dst_strides) = coalesce(src_offsets.shape, src_fit[1], dst_fit[1])
            if len(shape) <= MAX_RANK:
                args = [dst, src, n, int8_vector(shape, 1), int8_vector(src_strides, 0),
                        int8_vector(dst_strides, 0), np.int32(src_fit[0]), np.int32(dst_fit[0])]
                self.prepare("copy.cl", f"strided_copy_{width}", args, (int(n),), defines={"RANK": len(shape)})
                return
        maps = [self.backend.device.constant(np.ascontiguousarray(a, dtype=np.int32).reshape(-1))
                for a in (src_offsets, dst_offsets)]
        self.prepare("copy.cl", f"mapped_copy_{width}", [dst, src, n, *maps], (int(n),))


class OpenCLGatherCopy(OpenCLCopy):
    """StridedSlice, GatherV2, Gather: every input but the first is known on the host. One that
    takes every element in order (the logits slice of a prefill that wants all rows) is a view."""

    @classmethod
    def decline(cls, inputs, outputs, node):
        return "indices computed on the device" if any(t.host is None for t in inputs[1:]) else None

    def plan(self, inputs, outputs):
        source, out = gather_sources(self.node, inputs).reshape(-1), outputs[0]
        if source.size == inputs[0].size and np.array_equal(source, np.arange(source.size)):
            self.view_of = 0
            return
        self.copy(out, inputs[0], source.reshape(out.shape), index_stand_in(out.shape))


class OpenCLConcat(OpenCLCopy):
    """One copy per input into its region of the output."""

    def plan(self, inputs, outputs):
        for part, destination in zip(inputs, concat_destinations(self.node, inputs)):
            self.copy(outputs[0], part, index_stand_in(part.shape), destination)


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {**{op: OpenCLView for op in VIEW_OPS}, "StridedSlice": OpenCLGatherCopy, "GatherV2": OpenCLGatherCopy,
              "Gather": OpenCLGatherCopy, "Concat": OpenCLConcat}
