"""Pipeline: one resize of the graph for one set of input shapes, then cheap replays.

At resize, placement (runtime/placement.py) first decides where each op runs: folded on the
host, on the backend, or on the CPU backup when the backend declines it. Then each placed op
gets its Execution, with copies inserted where a tensor changes backend.
`run()` replays only the Executions: no planning per step.
"""

from __future__ import annotations

from dataclasses import dataclass

from mnngpu.backend import Backend, Execution, Node, Tensor
from mnngpu.errors import ModelFormatError
from mnngpu.runtime import placement
from mnngpu.runtime.graph import NUMERIC_ERRORS, GraphOp, named_error, op_errors_named
from mnngpu.runtime.placement import Assignment, PlacementTable


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
    def __init__(self, ops: list[GraphOp], backend: Backend, cpu_backup: Backend,
                 placements: PlacementTable | None = None):
        self.ops = ops
        self.backend = backend
        self.cpu_backup = cpu_backup
        self.placements = placements
        self.steps: list[Step] = []
        self.assignments: list[Assignment] = []
        self.owner: dict[int, Backend] = {}  # id(tensor) -> backend holding its device buffer
        self.host_twins: dict[tuple[int, int], Tensor] = {}  # (id(host value), id(backend)) -> its upload there

    def resize(self, tensors: list[Tensor | None]) -> None:
        """`tensors` holds the graph inputs and constants; fills in every other tensor."""
        self.steps = []
        self.host_twins = {}
        self.assignments = placement.assign(self.ops, tensors, self.backend, self.cpu_backup)
        if self.placements is not None:
            self.placements.record(self.assignments)
        for backend in {self.backend, self.cpu_backup}:
            backend.onResizeBegin()
        for assignment in self.assignments:
            if assignment.backend is not None:
                with op_errors_named(assignment.op.node, "does not fit its inputs"):
                    self._create(assignment)
        for backend in {self.backend, self.cpu_backup}:
            backend.onResizeEnd()

    def bind_input(self, tensor: Tensor) -> None:
        """A graph input whose device buffer the Session fills before each run."""
        self.backend.alloc(tensor)
        self.owner[id(tensor)] = self.backend

    def _create(self, assignment: Assignment) -> None:
        backend, node = assignment.backend, assignment.op.node
        if backend is not self.backend:
            self.backend.declined(assignment.inputs, assignment.outputs, node)
            placement.rearrange_for(backend, node)
        execution = backend.onCreate(assignment.inputs, assignment.outputs, node)
        if execution is None:
            raise ModelFormatError(f"the {backend.type} backend accepted op type {node.type} and then "
                                   "made no Execution for it", field=node.name)
        inputs = [self._on_backend(t, backend) for t in assignment.inputs]
        for tensor in assignment.outputs:
            backend.alloc(tensor)
            self.owner[id(tensor)] = backend
        execution.onResize(inputs, assignment.outputs)
        if execution.needs_run:
            self.steps.append(Step(execution, inputs, assignment.outputs))

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
        if tensor.host is not None:
            return self._host_value_on(tensor, backend)
        copy = Tensor(tensor.shape, tensor.dtype, name=tensor.name + ":copy")
        backend.alloc(copy)
        self.owner[id(copy)] = backend
        self.steps.append(Step(CopyToBackend(holder, backend), [tensor], [copy]))
        return copy

    def _host_value_on(self, tensor: Tensor, backend: Backend) -> Tensor:
        """A host value another backend already holds: uploaded to `backend` too, once, with the
        host value kept (an index op plans its copy from it at resize)."""
        twin = self.host_twins.get((id(tensor), id(backend)))
        if twin is None:
            twin = Tensor(tensor.shape, tensor.dtype, name=f"{tensor.name}:{backend.type}", host=tensor.host)
            backend.upload(twin, tensor.host)
            self.owner[id(twin)] = backend
            self.host_twins[(id(tensor), id(backend))] = twin
        return twin

    def run(self) -> None:
        step = None
        try:
            for step in self.steps:
                step.execution.onExecute(step.inputs, step.outputs)
        except NUMERIC_ERRORS as exc:
            raise named_error(step.execution.node, "failed on this model's values", exc) from exc
        self.backend.finish()
        if self.cpu_backup is not self.backend:
            self.cpu_backup.finish()

    def backend_of(self, tensor: Tensor) -> Backend | None:
        return self.owner.get(id(tensor))
