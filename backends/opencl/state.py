"""A recurrent layer's state in OpenCL buffers: backend.kv's StateCache protocol for the device
LinearAttention (ops/linear_attention.py), kept in the backend's `state_caches` under the op's name.

backend.device_caches.DeviceStateCache holds what every device's state shares; here, the OpenCL buffers. The
parts are float32 at every precision; the saved input rows are in the backend's float storage.
Everything a sequence owns is here, none of it in the execution.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from mnngpu.backend.device_caches import DeviceStateCache

FLOAT32 = np.dtype(np.float32)


class CLStateCache(DeviceStateCache):
    def _new(self, shape: tuple[int, ...]) -> cl.Buffer:
        return self.backend.device.buffer(int(np.prod(shape)) * FLOAT32.itemsize)

    def _new_rows(self, rows: int, width: int) -> cl.Buffer:
        return self.backend.device.buffer(rows * width * self.backend.float_storage.itemsize)

    def _buffer_bytes(self, buffer: cl.Buffer) -> int:
        return buffer.size

    def read(self) -> dict[str, np.ndarray]:
        parts = {}
        for name, shape in self._shapes.items():
            parts[name] = np.empty(shape, dtype=FLOAT32)
            cl.enqueue_copy(self.backend.queue, parts[name], self.parts[name], is_blocking=True)
        return parts

    def _write(self, parts: dict[str, np.ndarray]) -> None:
        for name, part in parts.items():
            cl.enqueue_copy(self.backend.queue, self.parts[name], np.ascontiguousarray(part, dtype=FLOAT32),
                            is_blocking=True)

    def _zero(self) -> None:
        for buffer in self.parts.values():
            cl.enqueue_fill_buffer(self.backend.queue, buffer, np.uint8(0), 0, buffer.size)

    def _copy(self, source: dict[str, cl.Buffer], target: dict[str, cl.Buffer]) -> None:
        for name in self._shapes:
            cl.enqueue_copy(self.backend.queue, target[name], source[name])


adopt = CLStateCache.adopt
