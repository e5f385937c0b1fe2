"""What every Vulkan Execution shares: recording dispatches at resize, marking them due at execute,
and the padded shape and stride arrays the strided kernels take as push constants."""

from __future__ import annotations

from mnngpu.backend import Execution
from mnngpu.backends.vulkan.memory import DeviceTensor
from mnngpu.backends.vulkan.program import CommandSegment, Dispatch, grid
from mnngpu.errors import ModelFormatError

GROUP_SIZE = 64  # local_size_x of every elementwise kernel
MAX_RANK = 6     # dims of a strided loop after merging (the copy, binary and rope kernels)


class VulkanExecution(Execution):
    segment: CommandSegment | None = None

    @classmethod
    def decline(cls, inputs, outputs, node) -> str | None:
        """Why this op, with these shapes, must run on the CPU backup instead; None when it need not."""
        return None

    def dispatch(self, kernel_name: str, bindings: list[DeviceTensor], push: bytes,
                 groups: int | tuple[int, int, int], writes: tuple[int, ...] = (-1,)) -> None:
        """Record one dispatch into the backend's open segment: `groups` workgroups laid out by
        grid() for group_index(), or an explicit (x, y, z) for kernels that read their own ids."""
        backend = self.backend
        kernel = backend.device.kernel(kernel_name, len(bindings))
        counts = groups if isinstance(groups, tuple) else grid(groups, backend.device.max_groups)
        self.segment = backend._record(Dispatch(kernel, bindings, push, counts, writes))

    def onExecute(self, inputs, outputs):
        if self.segment is not None:
            self.backend._enqueue(self.segment)


def element_groups(n: int) -> int:
    return -(-int(n) // GROUP_SIZE)


def padded(values: list[int], what: str) -> list[int]:
    """`values` filled up to MAX_RANK entries for a push-constant array."""
    if len(values) > MAX_RANK:
        raise ModelFormatError(f"{what}: at most {MAX_RANK} dims after merging, got {len(values)}")
    return list(values) + [0] * (MAX_RANK - len(values))
