"""Pipeline: one resize of the graph for one set of input shapes, then cheap replays.

At resize, ops whose inputs are all known on the host (shape arithmetic, constants) are
folded with numpy; every other op gets an Execution from the backend, or from the CPU backup
when the backend declines it, with copies inserted where a tensor changes backend.
`run()` replays only the Executions: no planning per step.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from mnngpu.backend import Backend, Execution, Node, Tensor
from mnngpu.errors import ModelFormatError
from mnngpu.runtime import host_ops, shapes


# What numpy/numba raise when a damaged graph's values (a reshape target, an axis, a slice
# bound) do not fit the tensors: reported as a format error naming the op.
NUMERIC_ERRORS = (ArithmeticError, ValueError, IndexError, TypeError)


def _named_error(node: Node, what: str, exc: Exception) -> ModelFormatError:
    return ModelFormatError(f"op {node.type} {what}: {exc}", field=node.name)


@contextmanager
def op_errors_named(node: Node, what: str):
    try:
        yield
    except NUMERIC_ERRORS as exc:
        raise _named_error(node, what, exc) from exc


@dataclass
class GraphOp:
    node: Node
    inputs: list[int]
    outputs: list[int]


@dataclass
class Step:
    execution: Execution
    inputs: list[Tensor]
    outputs: list[Tensor]


class CopyToBackend(Execution):
    """Moves a tensor between two backends through the host."""

    def __init__(self, source: Backend, target: Backend):
        super().__init__(target, Node("Copy", "copy"))
        self.source = source

    def onExecute(self, inputs, outputs):  # noqa: N802
        self.backend.upload(outputs[0], self.source.download(inputs[0]))


class Pipeline:
    def __init__(self, ops: list[GraphOp], backend: Backend, cpu_backup: Backend):
        self.ops = ops
        self.backend = backend
        self.cpu_backup = cpu_backup
        self.steps: list[Step] = []
        self.owner: dict[int, Backend] = {}  # id(tensor) -> backend holding its device buffer

    def resize(self, tensors: list[Tensor | None]) -> None:
        """`tensors` holds the graph inputs and constants; fills in every other tensor."""
        self.steps = []
        for backend in {self.backend, self.cpu_backup}:
            backend.onResizeBegin()
        for op in self.ops:
            inputs = [tensors[i] for i in op.inputs]
            with op_errors_named(op.node, "does not fit its inputs"):
                if op.node.type in host_ops.SHAPE_OPS or (
                        op.node.type in host_ops.HOST_OPS and all(t.host is not None for t in inputs)):
                    self._fold(op, inputs, tensors)
                else:
                    self._place(op, inputs, tensors)
        for backend in {self.backend, self.cpu_backup}:
            backend.onResizeEnd()

    def bind_input(self, tensor: Tensor) -> None:
        """A graph input whose device buffer the Session fills before each run."""
        self.backend.alloc(tensor)
        self.owner[id(tensor)] = self.backend

    def _fold(self, op: GraphOp, inputs: list[Tensor], tensors: list[Tensor | None]) -> None:
        values = host_ops.evaluate(op.node, [t.host if t.host is not None else host_ops.shape_stand_in(t) for t in inputs])
        for index, value in zip(op.outputs, values):
            value = np.asarray(value)
            tensors[index] = Tensor(value.shape, value.dtype, name=op.node.name, host=value)

    def _place(self, op: GraphOp, inputs: list[Tensor], tensors: list[Tensor | None]) -> None:
        outputs = [Tensor(tuple(int(d) for d in shape), np.dtype(dtype), name=op.node.name)
                   for shape, dtype in shapes.infer(op.node, inputs)]
        backend = self.backend
        execution = backend.onCreate(inputs, outputs, op.node)
        if execution is None:
            backend = self.cpu_backup
            execution = backend.onCreate(inputs, outputs, op.node)
        if execution is None:
            raise ModelFormatError(f"no backend can run op type {op.node.type}", field=op.node.name)
        inputs = [self._on_backend(t, backend) for t in inputs]
        for tensor in outputs:
            backend.alloc(tensor)
            self.owner[id(tensor)] = backend
        execution.onResize(inputs, outputs)
        if execution.needs_run:
            self.steps.append(Step(execution, inputs, outputs))
        for index, tensor in zip(op.outputs, outputs):
            tensors[index] = tensor

    def _on_backend(self, tensor: Tensor, backend: Backend) -> Tensor:
        """The tensor as `backend` can read it: constants are uploaded once, activations copied."""
        holder = self.owner.get(id(tensor))
        if holder is backend:
            return tensor
        if holder is None:  # a host value (constant or folded): upload once, now
            assert tensor.host is not None, f"tensor {tensor.name} has no value"
            backend.upload(tensor, tensor.host)
            self.owner[id(tensor)] = backend
            return tensor
        copy = Tensor(tensor.shape, tensor.dtype, name=tensor.name + ":copy")
        backend.alloc(copy)
        self.owner[id(copy)] = backend
        self.steps.append(Step(CopyToBackend(holder, backend), [tensor], [copy]))
        return copy

    def run(self) -> None:
        step = None
        try:
            for step in self.steps:
                step.execution.onExecute(step.inputs, step.outputs)
        except NUMERIC_ERRORS as exc:
            raise _named_error(step.execution.node, "failed on this model's values", exc) from exc
        self.backend.finish()
        if self.cpu_backup is not self.backend:
            self.cpu_backup.finish()

    def backend_of(self, tensor: Tensor) -> Backend | None:
        return self.owner.get(id(tensor))
