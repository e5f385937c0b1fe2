"""Data movement on the device: views that share a buffer, and strided copies.

Reshape, Squeeze, Unsqueeze, ConvertTensor and Identity change no values (NC4HW4 is
logically NCHW here), so their output aliases the input's buffer and costs nothing per step.
StridedSlice, GatherV2 and Concat copy, planned from mnngpu.runtime.host_ops run on index
stand-ins (see layout.py), so their semantics are written once, in host_ops.
"""

from __future__ import annotations

import numpy as np
from mnngpu.backends.opencl.ops.launch import KernelExecution
from mnngpu.backends.opencl.ops.layout import MAX_RANK, affine_strides, compact, index_stand_in, int8_vector

from mnngpu.backend import Execution, Tensor
from mnngpu.runtime import host_ops


class ViewExecution(Execution):
    def onResize(self, inputs, outputs):
        outputs[0].device = self.backend.buffer(inputs[0])

    def onExecute(self, inputs, outputs):
        """Nothing to do: the output is the input's buffer."""


class CopyExecution(KernelExecution):
    def copy(self, dst: Tensor, src: Tensor, src_offsets: np.ndarray, dst_offsets: np.ndarray) -> None:
        """dst[dst_offsets[i]] = src[src_offsets[i]] over the elements i of one copy shape."""
        if src_offsets.size == 0:
            return
        width = "u16" if self.backend.itemsize(src) == 2 else "u32"
        src_fit, dst_fit = affine_strides(src_offsets), affine_strides(dst_offsets)
        n = np.int32(src_offsets.size)
        buffers = [self.backend.buffer(dst), self.backend.buffer(src), n]
        if src_fit is not None and dst_fit is not None:
            shape, (src_strides, dst_strides) = compact(src_offsets.shape, [src_fit[1], dst_fit[1]])
            if len(shape) <= MAX_RANK:
                args = [int8_vector(shape, 1), int8_vector(src_strides, 0), int8_vector(dst_strides, 0),
                        np.int32(src_fit[0]), np.int32(dst_fit[0])]
                self.prepare("copy.cl", f"strided_copy_{width}", buffers + args, (int(n),),
                             defines={"RANK": len(shape)})
                return
        maps = [self.backend.device.constant(np.ascontiguousarray(a, dtype=np.int32).reshape(-1))
                for a in (src_offsets, dst_offsets)]
        self.maps = maps  # kept alive with the kernel that reads them
        self.prepare("copy.cl", f"mapped_copy_{width}", buffers + maps, (int(n),))


class GatherCopyExecution(CopyExecution):
    """StridedSlice, GatherV2, Gather: every input but the first is known on the host."""

    def onResize(self, inputs, outputs):
        self.launches = []
        source = host_ops.evaluate(self.node, [index_stand_in(inputs[0].shape), *(t.host for t in inputs[1:])])[0]
        out = outputs[0]
        self.copy(out, inputs[0], np.asarray(source).reshape(out.shape), index_stand_in(out.shape))


class ConcatExecution(CopyExecution):
    """One copy per input into its region of the output."""

    def onResize(self, inputs, outputs):
        self.launches = []
        absent = [np.full(t.shape, -1, dtype=np.int64) for t in inputs]
        for j, part in enumerate(inputs):
            stand_ins = absent[:j] + [index_stand_in(part.shape)] + absent[j + 1:]
            layout = np.asarray(host_ops.concat(self.node, stand_ins)).reshape(-1)
            positions = np.flatnonzero(layout >= 0)
            destination = np.empty(part.size, dtype=np.int64)
            destination[layout[positions]] = positions
            self.copy(outputs[0], part, index_stand_in(part.shape), destination.reshape(part.shape))

