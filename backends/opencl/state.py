"""A recurrent layer's state in OpenCL buffers: runtime.kv's StateCache protocol for the device
LinearAttention (ops/linear_attention.py), kept in the backend's `state_caches` under the op's name.

Besides the state's parts (float32 at every precision) it holds what takes a verify forward back:
the parts as they were before it (`before`) and its real input rows, which the kernels copy into
`saved` (qkv (rows, channels), and gate and beta (rows, v heads) for the gated delta rule, in the
backend's float storage). Everything a sequence owns is here, none of it in the execution.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

FLOAT32 = np.dtype(np.float32)


class CLStateCache:
    def __init__(self, backend, shapes: dict[str, tuple[int, ...]]):
        self.backend = backend
        self._shapes = {name: tuple(shape) for name, shape in shapes.items()}
        self.parts = {name: self._new(shape) for name, shape in self._shapes.items()}
        self.before: dict[str, cl.Buffer] = {}
        self.saved: dict[str, cl.Buffer] = {}   # "qkv", and "gate", "beta" for the gated delta rule
        self.saved_rows = 0                      # rows `saved` has room for
        self.undo_rows = 0                       # real rows of the last forward, where it was a verify

    def _new(self, shape: tuple[int, ...]) -> cl.Buffer:
        return self.backend.device.buffer(int(np.prod(shape)) * FLOAT32.itemsize)

    # ---- the StateCache protocol ----------------------------------------------------------------
    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    @property
    def nbytes(self) -> int:
        return sum(buffer.size for buffer in (*self.parts.values(), *self.before.values(), *self.saved.values()))

    @property
    def undoable(self) -> int:
        return self.undo_rows

    def read(self) -> dict[str, np.ndarray]:
        parts = {}
        for name, shape in self._shapes.items():
            parts[name] = np.empty(shape, dtype=FLOAT32)
            cl.enqueue_copy(self.backend.queue, parts[name], self.parts[name], is_blocking=True)
        return parts

    def write(self, parts: dict[str, np.ndarray]) -> None:
        if {name: np.shape(part) for name, part in parts.items()} != self._shapes:
            raise ValueError(f"a state of {self._shapes}, got {({n: np.shape(p) for n, p in parts.items()})}")
        for name, part in parts.items():
            cl.enqueue_copy(self.backend.queue, self.parts[name], np.ascontiguousarray(part, dtype=FLOAT32),
                            is_blocking=True)
        self.forget()

    def reset(self) -> None:
        for buffer in self.parts.values():
            cl.enqueue_fill_buffer(self.backend.queue, buffer, np.uint8(0), 0, buffer.size)
        self.forget()

    # ---- taking a verify forward back ---------------------------------------------------------
    def room_for_rows(self, rows: int, widths: dict[str, int]) -> None:
        """Make `saved` hold `rows` rows of each input (width: values per row); the before-parts too."""
        if rows <= self.saved_rows:
            return
        itemsize = self.backend.float_storage.itemsize
        self.saved = {name: self.backend.device.buffer(rows * width * itemsize) for name, width in widths.items()}
        self.saved_rows = rows
        self.before = {name: self._new(shape) for name, shape in self._shapes.items()}

    def remember(self, rows: int) -> None:
        """The coming forward is a verify block of `rows` real rows: keep the parts as they are now
        (its kernels save the rows themselves)."""
        for name, buffer in self.parts.items():
            cl.enqueue_copy(self.backend.queue, self.before[name], buffer)
        self.undo_rows = rows

    def restore(self) -> None:
        """The parts as they were before the last verify forward."""
        for name, buffer in self.parts.items():
            cl.enqueue_copy(self.backend.queue, buffer, self.before[name])
        self.forget()

    def forget(self) -> None:
        self.undo_rows = 0


def adopt(backend, name: str, shapes: dict[str, tuple[int, ...]]) -> CLStateCache:
    """The device state of op `name`: made zero where absent; where the prefix cache wrote host
    parts before the op first ran (runtime.kv.write_states), those parts moved onto the device."""
    state = backend.state_caches.get(name)
    if isinstance(state, CLStateCache):
        return state
    device = CLStateCache(backend, shapes)
    if state is None:
        device.reset()
    else:
        device.write(state.read())
    backend.state_caches[name] = device
    return device
