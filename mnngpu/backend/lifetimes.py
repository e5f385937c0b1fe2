"""When each tensor of one resized pipeline is written and last read: what a backend's buffer
planner needs to let tensors with disjoint lifetimes share memory.

A view op (reshape, squeeze, ...) owns no memory: its output is its input's buffer, so the
input's lifetime runs until the view's own last reader. Lifetimes are keyed by id() of the
root tensor, the one that owns the buffer. A tensor no step reads (a graph output), or a view of
it no step reads, keeps its buffer until the run ends: the Session downloads it after the run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mnngpu.backend import Tensor


@dataclass
class PlannedStep:
    """What the planner needs to know about one execution, in run order."""

    inputs: list[Tensor]
    outputs: list[Tensor]
    view_of: int | None = None   # output 0 is a view of inputs[view_of]


@dataclass
class Lifetimes:
    roots: dict[int, Tensor] = field(default_factory=dict)   # id(view output) -> the tensor owning its buffer
    produced: dict[int, int] = field(default_factory=dict)   # id(root) -> the step that writes it
    last_read: dict[int, int] = field(default_factory=dict)  # id(root) -> the last step that reads it
    unread: set[int] = field(default_factory=set)   # id(root) of each tensor (or view) no step reads

    def root_of(self, tensor: Tensor) -> Tensor:
        return self.roots.get(id(tensor), tensor)

    def dies_after(self, keys: Iterable[int]) -> dict[int, list[int]]:
        """step -> the keys (of `keys`, written here and read later) whose memory is free after it."""
        free: dict[int, list[int]] = {}
        for key in keys:
            if key in self.produced and key not in self.unread and self.last_read.get(key, -1) > self.produced[key]:
                free.setdefault(self.last_read[key], []).append(key)
        return free


def lifetimes(steps: list[PlannedStep]) -> Lifetimes:
    found = Lifetimes()
    for index, step in enumerate(steps):
        if step.view_of is not None:
            found.roots[id(step.outputs[0])] = found.root_of(step.inputs[step.view_of])
        for tensor in step.inputs:
            found.last_read[id(found.root_of(tensor))] = index
        if step.view_of is None:
            for tensor in step.outputs:
                found.produced.setdefault(id(tensor), index)
    read = {id(tensor) for step in steps for tensor in step.inputs}
    found.unread = {id(found.root_of(tensor)) for step in steps for tensor in step.outputs if id(tensor) not in read}
    return found
