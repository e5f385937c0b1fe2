"""Data movement on the CPU: the view ops (mnngpu.ops.movement.VIEW_OPS) share their input's array.

The copying ones (StridedSlice, Gather, Concat, ...) run their host rule through
ops/base.py's CPUHostOp.
"""

from __future__ import annotations

from mnngpu.backends.cpu.ops.base import CPUExecution
from mnngpu.ops.movement import VIEW_OPS


class CPUView(CPUExecution):
    """Reshape, Squeeze, Unsqueeze, ConvertTensor, Identity on an activation: the output is the
    input's buffer with the output's shape, set up at resize, so nothing runs per step."""

    needs_run = False
    view_of = 0

    def onExecute(self, inputs, outputs):  # noqa: N802
        pass


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {op: CPUView for op in VIEW_OPS}
