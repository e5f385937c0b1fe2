"""Data movement on the device: views that share a buffer, and copies through index maps.

The view ops (mnngpu.ops.movement.VIEW_OPS) change no values, so their output is the input's
buffer and they cost nothing per step. StridedSlice, GatherV2 and Concat are planned by
mnngpu.backend.movement from their host rules, so their semantics stay written once, in
mnngpu/ops/movement.py.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend import Execution, Tensor
from mnngpu.backend.movement import concat_destinations, gather_sources
from mnngpu.backends.cuda.device import BLOCK, grid_for
from mnngpu.backends.cuda.ops.base import CUDAExecution
from mnngpu.ops.movement import VIEW_OPS


class CUDAView(Execution):
    needs_run = False
    capturable = True

    def __init__(self, backend, node):
        super().__init__(backend, node)
        self.recording = backend.graphs.register(self)

    def onResize(self, inputs, outputs):
        outputs[0].device = self.backend._buffer(inputs[0])

    def launch(self) -> None:
        """Nothing to launch: the output is the input's buffer."""

    def onExecute(self, inputs, outputs):
        """Nothing to do (the Pipeline leaves it out of the replay)."""


class CUDAMapCopy(CUDAExecution):
    def copy(self, kind: str, src: Tensor, dst: Tensor, index: np.ndarray) -> None:
        """gather: dst[i] = src[index[i]]; scatter: dst[index[i]] = src[i] (raw 16/32-bit words)."""
        if index.size == 0:
            return
        width = 8 * self.backend._itemsize(src)
        device_index = self.backend.device.to_device(np.ascontiguousarray(index, dtype=np.int32).reshape(-1))
        self.maps = [*getattr(self, "maps", []), device_index]  # kept alive with the launch
        n = np.int32(index.size)
        self.prepare("copy.cu", f"{kind}_u{width}", grid_for(n), (BLOCK,),
                     (n, self.backend._buffer(src), device_index, self.backend._buffer(dst)))


class CUDAIndexCopy(CUDAMapCopy):
    """StridedSlice, GatherV2, Gather: every input but the first is known on the host."""

    @classmethod
    def decline(cls, inputs, outputs, node):
        return "indices computed on the device" if any(t.host is None for t in inputs[1:]) else None

    def onResize(self, inputs, outputs):
        self.copy("gather", inputs[0], outputs[0], gather_sources(self.node, inputs).reshape(-1))


class CUDAConcat(CUDAMapCopy):
    """One scatter per input into its place in the output."""

    def onResize(self, inputs, outputs):
        for part, destination in zip(inputs, concat_destinations(self.node, inputs)):
            self.copy("scatter", part, outputs[0], destination.reshape(-1))


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {**{op: CUDAView for op in VIEW_OPS}, "StridedSlice": CUDAIndexCopy, "GatherV2": CUDAIndexCopy,
              "Gather": CUDAIndexCopy, "Concat": CUDAConcat}
