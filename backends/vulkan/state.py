"""A recurrent layer's state in Vulkan buffers: backend.kv's StateCache protocol for the device
LinearAttention (ops/linear_attention.py), kept in the backend's `state_caches` under the op's name.

backend.device_caches.DeviceStateCache holds what every device's state shares; here, the Vulkan buffers (the
parts and the saved input rows all float32). Everything a sequence owns is here, none of it in the
execution.

The host-side operations (read, write, reset, remember, restore) run at once, between submits:
every forward ends with the backend's finish(), and a layer's own recorded commands are the only
ones that touch its state.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend.device_caches import DeviceStateCache
from mnngpu.backends.vulkan.memory import DeviceTensor

FLOAT32 = np.dtype(np.float32)


class VulkanStateCache(DeviceStateCache):
    def _new(self, shape: tuple[int, ...]) -> DeviceTensor:
        return self._new_rows(1, int(np.prod(shape)))

    def _new_rows(self, rows: int, width: int) -> DeviceTensor:
        return self.backend._new_buffer(rows * width * FLOAT32.itemsize, FLOAT32)

    def _buffer_bytes(self, buffer: DeviceTensor) -> int:
        return buffer.nbytes

    def read(self) -> dict[str, np.ndarray]:
        return {name: self.parts[name].read().reshape(shape).astype(FLOAT32) for name, shape in self._shapes.items()}

    def _write(self, parts: dict[str, np.ndarray]) -> None:
        for name, part in parts.items():
            self.parts[name].write(np.asarray(part, dtype=FLOAT32).reshape(-1))

    def _zero(self) -> None:
        for tensor in self.parts.values():
            tensor.write(np.zeros(tensor.nbytes // FLOAT32.itemsize, dtype=FLOAT32))

    def _copy(self, source: dict[str, DeviceTensor], target: dict[str, DeviceTensor]) -> None:
        regions = [(source[name].buffer, 0, target[name].buffer, 0, target[name].nbytes) for name in self._shapes]
        self.backend.arena.copy(regions)


adopt = VulkanStateCache.adopt
