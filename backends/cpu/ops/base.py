"""The CPU executions' common shape: planned executions (mnngpu/backend/planned.py) over numpy arrays.

`onResize` keeps the tensors and does shape-only setup (`plan`); the backend lays every
buffer into one arena at the end of the resize (backends/cpu/memory.py) and then calls `bind()`
on each execution in order, which takes the arrays it will read and write. `onExecute` ignores
its arguments and runs kernels on those arrays, so a replayed step costs one Python call and one
kernel dispatch.

`CPUHostOp` runs any op that has a host rule on activations, so the CPU takes every op of
the core table without a kernel of its own.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend import Tensor
from mnngpu.backend.planned import PlannedExecution
from mnngpu.backends.cpu import memory
from mnngpu.ops import op_table


class CPUExecution(PlannedExecution):
    @classmethod
    def pack(cls, backend, node) -> None:
        """A norm's gamma read from the weight file each step keeps the file's page under it
        resident, and where the kernel maps the file in 2 MB pages that is 2 MB a norm (60 MB for a
        24-layer model); the repacked matrices no longer hold those pages. So small weights are
        copied out of the file."""
        for name, array in node.weights.items():
            if memory.is_small_file_view(array):
                node.weights[name] = np.array(array)

    @staticmethod
    def value(tensor: Tensor) -> np.ndarray:
        """A tensor's array: its host value when it is a constant, else its buffer."""
        return tensor.host if tensor.host is not None else tensor.device


class CPUHostOp(CPUExecution):
    """Any op with a host rule (mnngpu/ops/<family>.py) on activations: evaluate, then copy into the
    output buffer."""

    def bind(self):
        self.args = [self.value(t) for t in self.inputs]
        self.out = self.outputs[0].device
        self.outs = [t.device for t in self.outputs]

    def onExecute(self, inputs, outputs):  # noqa: N802
        for out, result in zip(self.outs, op_table.evaluate(self.node, self.args)):
            np.copyto(out, result, casting="unsafe")


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {name: CPUHostOp for name, op in op_table.OPS.items() if op.host and not op.shape_only}
