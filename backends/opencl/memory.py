"""Which buffer every activation of one resized pipeline lives in, planned by lifetime.

At the end of a resize the backend knows its executions in run order and the tensors each reads
and writes. A tensor takes a buffer from the pool when its producer runs and gives it back
after its last reader, so a 100-row prefill needs a few activations' worth of memory instead of
one buffer per tensor. Views own no buffer: their output is their input's, which stays taken
until the view's own last reader.

The pool is whole OpenCL buffers (no sub-buffers, so no base-address alignment rules and no
single allocation larger than the device allows), shared by every pipeline of the backend: the
pipelines of a pool's modules never run at the same time, and between runs no pooled tensor
holds anything. Tensors that live across runs get their own buffer: those that no execution
here writes (graph inputs, constants, copies from another backend), those nobody here reads,
directly or through a view (graph outputs, downloaded after the run), and `pinned` ones (read
by another backend's copy).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import pyopencl as cl

from mnngpu.backend.lifetimes import PlannedStep, lifetimes
from mnngpu.backend.planned import PlannedExecution


@dataclass
class BufferPool:
    """Free buffers by size; the smallest that fits is taken, else a new one is made."""

    make: object                                   # nbytes -> cl.Buffer
    buffers: list[tuple[int, int, cl.Buffer]] = field(default_factory=list)   # every pooled buffer
    free: list[tuple[int, int]] = field(default_factory=list)                  # sorted (size, index)

    def reset(self) -> None:
        """A new plan: nothing pooled is in use."""
        self.free = sorted((size, index) for size, index, _ in self.buffers)

    def take(self, nbytes: int) -> tuple[int, cl.Buffer]:
        at = bisect.bisect_left(self.free, (nbytes, -1))
        if at < len(self.free):
            _, index = self.free.pop(at)
            return index, self.buffers[index][2]
        index = len(self.buffers)
        self.buffers.append((nbytes, index, self.make(nbytes)))
        return index, self.buffers[index][2]

    def give(self, index: int) -> None:
        bisect.insort(self.free, (self.buffers[index][0], index))

    @property
    def nbytes(self) -> int:
        return sum(size for size, _, _ in self.buffers)


def plan(steps: list[PlannedExecution], pool: BufferPool, nbytes_of, make_own, pinned: set[int]) -> None:
    """Give every tensor the executions touch a buffer (`tensor.device`)."""
    found = lifetimes([PlannedStep(s.inputs, s.outputs, s.view_of) for s in steps])
    # a pinned view pins the buffer it views (the CPU backup's copy out of it reads that buffer)
    seen = {id(t): t for s in steps for t in (*s.inputs, *s.outputs)}
    pinned = set(pinned) | {id(found.root_of(seen[k])) for k in pinned if k in seen}
    dies_after = found.dies_after(key for key in found.produced if key not in pinned)
    pooled = {key for keys in dies_after.values() for key in keys}

    pool.reset()
    taken: dict[int, int] = {}
    for index, step in enumerate(steps):
        for tensor in step.outputs:
            if id(tensor) in pooled and tensor.device is None:
                taken[id(tensor)], tensor.device = pool.take(nbytes_of(tensor))
        for key in dies_after.get(index, []):
            if key in taken:
                pool.give(taken[key])
    for step in steps:
        for tensor in (*step.inputs, *step.outputs):
            owner = found.root_of(tensor)
            if owner.device is None:
                owner.device = make_own(owner)
            tensor.device = owner.device
