"""What every OpenCL Execution shares: OpenCLExecution, a planned execution (mnngpu/backend/planned.py)
that prepares its kernels at onResize and only enqueues them at onExecute, and the int8 vectors
the kernels take shapes and strides in.

At onResize (`plan`) an execution creates its kernels and lists their arguments, naming tensors
rather than buffers; the backend records it. At the end of the resize the backend gives every
tensor a buffer (memory.py) and calls `bind`, which sets the kernels' arguments once. Replaying
a step then costs one enqueue per kernel and no planning.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyopencl as cl
from pyopencl import cltypes

from mnngpu.backend import Tensor
from mnngpu.backend.planned import PlannedExecution


@dataclass
class Launch:
    kernel: cl.Kernel
    args: list                   # scalars, buffers, and Tensors (bound to their buffers in `bind`)
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]


# Every kernel gets a fixed work-group size: PoCL compiles a kernel once per work-group size,
# so leaving the choice to the driver would compile each kernel again for every tensor shape.
FLAT_GROUP = (64,)
# Shapes and strides reach the kernels as int8 vectors, padded; the strides themselves are planned
# in mnngpu.backend.movement, shared by every backend.
MAX_RANK = 8


def _round_up(size: tuple[int, ...], local: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(max(1, -(-s // l)) * l for s, l in zip(size, local))


class OpenCLExecution(PlannedExecution):
    """`plan` prepares each kernel; a view (view_of set) has none."""

    def __init__(self, backend, node):
        super().__init__(backend, node)
        self.launches: list[Launch] = []

    def onResize(self, inputs, outputs):
        self.launches = []
        super().onResize(inputs, outputs)

    def prepare(self, source: str, name: str, args: list, global_size: tuple[int, ...],
                local_size: tuple[int, ...] = FLAT_GROUP, defines: dict | None = None) -> Launch:
        """Queue kernel `name` of shaders/opencl/<source> for every onExecute, with `args` bound
        at `bind`. Kernels guard their own tails, so the global size is rounded up to the local."""
        kernel = self.backend._kernel(source, name, defines or {})
        launch = Launch(kernel, args, _round_up(global_size, local_size), local_size)
        self.launches.append(launch)
        return launch

    def bind(self) -> None:
        """Every tensor has its buffer now: set the kernels' arguments."""
        for launch in self.launches:
            launch.kernel.set_args(*(a.device if isinstance(a, Tensor) else a for a in launch.args))

    def onExecute(self, inputs, outputs):
        queue = self.backend.queue
        for launch in self.launches:
            cl.enqueue_nd_range_kernel(queue, launch.kernel, launch.global_size, launch.local_size)


def int8_vector(values: list[int], fill: int) -> np.ndarray:
    """An OpenCL int8 argument: `values` right-aligned, outer dims padded with `fill`."""
    padded = [fill] * (MAX_RANK - len(values)) + list(values)
    return cltypes.make_int8(*padded)
