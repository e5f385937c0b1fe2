"""KernelExecution: an Execution that prepares its kernels once, at onResize, and only
enqueues them at onExecute. The kernels' arguments (buffers, shapes) are bound at onResize,
so replaying a step costs one enqueue per kernel and no planning."""

from __future__ import annotations

from dataclasses import dataclass

import pyopencl as cl

from mnngpu.backend import Execution


@dataclass
class Launch:
    kernel: cl.Kernel
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]


# Every kernel gets a fixed work-group size: PoCL compiles a kernel once per work-group size,
# so leaving the choice to the driver would compile each kernel again for every tensor shape.
FLAT_GROUP = (64,)


def _round_up(size: tuple[int, ...], local: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(max(1, -(-s // l)) * l for s, l in zip(size, local))


class KernelExecution(Execution):
    def __init__(self, backend, node):
        super().__init__(backend, node)
        self.launches: list[Launch] = []

    def prepare(self, source: str, name: str, args: list, global_size: tuple[int, ...],
                local_size: tuple[int, ...] = FLAT_GROUP, defines: dict | None = None) -> cl.Kernel:
        """Bind `args` to a new instance of kernel `name` from shaders/opencl/<source> and queue
        it for every onExecute. Kernels guard their own tails, so the global size is rounded up
        to the local size."""
        kernel = self.backend.kernel(source, name, defines or {})
        kernel.set_args(*args)
        self.launches.append(Launch(kernel, _round_up(global_size, local_size), local_size))
        return kernel

    def onExecute(self, inputs, outputs):
        queue = self.backend.queue
        for launch in self.launches:
            cl.enqueue_nd_range_kernel(queue, launch.kernel, launch.global_size, launch.local_size)
