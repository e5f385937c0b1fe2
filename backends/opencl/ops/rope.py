"""The fused rotary embedding (runtime/fusion.py's ROPE node) in one kernel instead of seven ops.

x (1, seq, heads, dim); cos and sin hold one row of the rotated width per position, shared by the heads.
When the node's slices are not the rotate-half split of the last axis, or cos/sin are laid out
otherwise, its original ops run as exported, each as this backend's own Execution.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend import Tensor
from mnngpu.backends.opencl.ops.base import OpenCLExecution
from mnngpu.ops import op_table
from mnngpu.ops.rope import ROPE, rotary_width, rotate_half_split, rows_error


class OpenCLRoPE(OpenCLExecution):
    def onResize(self, inputs, outputs):
        self.launches, self.as_exported = [], []
        self.split = rotate_half_split(self.node, inputs)
        if self.split is None and not self.node.param.ops:
            raise rows_error(self.node, inputs)
        if self.split is None:
            self._plan_as_exported(inputs, outputs)  # the ops' executions record themselves
            return
        super().onResize(inputs, outputs)

    def plan(self, inputs, outputs):
        x, out = inputs[0], outputs[0]
        _, _, heads, dim = x.shape
        args = [out, *inputs[:3], np.int32(heads), np.int32(dim), np.int32(rotary_width(self.node, x)),
                np.int32(self.split), np.int32(out.size)]
        self.prepare("rope.cl", "rope_rotate_half", args, (out.size,))

    def _plan_as_exported(self, inputs, outputs) -> None:
        p = self.node.param
        env: dict[int, Tensor] = dict(zip(p.inputs, inputs))
        for op in p.ops:
            op_inputs = [env[t] for t in op.inputs]
            if op.outputs[0] == p.output:
                op_outputs = outputs
            else:
                op_outputs = [Tensor(tuple(shape), np.dtype(dtype), name=op.node.name)
                              for shape, dtype in op_table.infer(op.node, op_inputs)]
            execution = self.backend.onCreate(op_inputs, op_outputs, op.node)
            if execution is None:
                raise NotImplementedError(f"RoPE's {op.node.type} {op.node.name} declined by the OpenCL backend")
            execution.onResize(op_inputs, op_outputs)
            self.as_exported.append((execution, op_inputs, op_outputs))
            env.update(zip(op.outputs, op_outputs))

    def onExecute(self, inputs, outputs):
        for execution, op_inputs, op_outputs in self.as_exported:
            execution.onExecute(op_inputs, op_outputs)
        super().onExecute(inputs, outputs)


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {ROPE: OpenCLRoPE}
