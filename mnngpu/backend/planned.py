"""Planned executions: record at resize, plan every buffer at the resize's end, then bind.

A backend that lays its activations out by lifetime (the CPU's arena, OpenCL's buffer pool)
knows where a tensor lives only once the whole resize is known. So an execution's onResize
does the shape-only setup (`plan`) and is recorded; at onResizeEnd the backend plans every
buffer and each execution, in run order, takes the buffers it works on (`bind`). onExecute then
only runs, so a replayed step costs no planning.

    onResize:     execution.plan(inputs, outputs); backend.recording.add(execution)
    onResizeEnd:  backend.recording.end() -> plan_buffers(executions); execution.bind() for each
"""

from __future__ import annotations

from collections.abc import Callable

from mnngpu.backend import Execution, Tensor


class PlannedExecution(Execution):
    """An Execution of a backend that plans buffers at the end of a resize (its `recording`)."""

    view_of: int | None = None   # output 0 is inputs[view_of]'s buffer, re-shaped (owns no bytes)

    def onResize(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:  # noqa: N802 (MNN's name)
        self.inputs, self.outputs = inputs, outputs
        self.plan(inputs, outputs)
        self.backend.recording.add(self)

    def plan(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        """Shape-dependent setup that needs no buffer."""

    def bind(self) -> None:
        """Every tensor has its buffer now: take what onExecute works on."""


class Recording:
    """The planned executions of one resize, in run order; `plan_buffers` gives every tensor they
    touch its buffer, then each is bound."""

    def __init__(self, plan_buffers: Callable[[list[PlannedExecution]], None]):
        self.plan_buffers = plan_buffers
        self.executions: list[PlannedExecution] | None = None   # None: not inside a resize

    def begin(self) -> None:
        self.executions = []

    def add(self, execution: PlannedExecution) -> None:
        if self.executions is None:   # resized on its own, outside a Pipeline's resize
            self._bind([execution])
        else:
            self.executions.append(execution)

    def end(self) -> list[PlannedExecution]:
        """Bind the resize's executions; they are returned in run order."""
        executions, self.executions = self.executions or [], None
        self._bind(executions)
        return executions

    def _bind(self, executions: list[PlannedExecution]) -> None:
        self.plan_buffers(executions)
        for execution in executions:
            execution.bind()
