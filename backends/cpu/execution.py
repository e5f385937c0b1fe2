"""The CPU executions' common shape: record at resize, bind once buffers exist, then only run.

`onResize` keeps the tensors and does shape-only setup (`prepare`); the backend plans every
buffer at the end of the resize (backends/cpu/memory.py) and then calls `bind()` on each
execution in order, which takes the arrays it will read and write. `onExecute` ignores its
arguments and runs kernels on those arrays, so a replayed step costs one Python call and one
kernel dispatch.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend import Execution, Tensor


class CPUExecution(Execution):
    view_of: int | None = None    # output 0 is inputs[view_of]'s buffer, re-shaped (owns no bytes)

    def onResize(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:  # noqa: N802 (MNN's name)
        self.inputs, self.outputs = inputs, outputs
        self.prepare(inputs, outputs)
        self.backend.record(self)

    def prepare(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        """Shape-dependent setup that needs no buffer."""

    def bind(self) -> None:
        """Buffers are assigned: take the arrays onExecute works on."""

    @staticmethod
    def value(tensor: Tensor) -> np.ndarray:
        """A tensor's array: its host value when it is a constant, else its buffer."""
        return tensor.host if tensor.host is not None else tensor.device


class ViewExecution(CPUExecution):
    """Reshape, Squeeze, Unsqueeze, ConvertTensor, Identity on an activation: the output is the
    input's buffer with the output's shape, set up at resize, so nothing runs per step."""

    needs_run = False
    view_of = 0

    def onExecute(self, inputs, outputs):  # noqa: N802
        pass
