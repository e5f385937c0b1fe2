"""A recurrent layer's state in Vulkan buffers: runtime.kv's StateCache protocol for the device
LinearAttention (ops/linear_attention.py), kept in the backend's `state_caches` under the op's name.

Besides the state's float32 parts it holds what takes a verify forward back: the parts as they
were before it (`before`) and its real input rows, which the kernels copy into `saved` (qkv
(rows, channels), and gate and beta (rows, v heads) for the gated delta rule). Everything a
sequence owns is here, none of it in the execution.

The host-side operations (read, write, reset, remember, restore) run at once, between submits:
every forward ends with the backend's finish(), and a layer's own recorded commands are the only
ones that touch its state.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backends.vulkan.memory import DeviceTensor

FLOAT32 = np.dtype(np.float32)


class VulkanStateCache:
    def __init__(self, backend, shapes: dict[str, tuple[int, ...]]):
        self.backend = backend
        self._shapes = {name: tuple(shape) for name, shape in shapes.items()}
        self.parts = {name: self._new(shape) for name, shape in self._shapes.items()}
        self.before: dict[str, DeviceTensor] = {}
        self.saved: dict[str, DeviceTensor] = {}   # "qkv", and "gate", "beta" for the gated delta rule
        self.saved_rows = 0                         # rows `saved` has room for
        self.undo_rows = 0                          # real rows of the last forward, where it was a verify

    def _new(self, shape: tuple[int, ...]) -> DeviceTensor:
        return self.backend._new_buffer(int(np.prod(shape)) * FLOAT32.itemsize, FLOAT32)

    # ---- the StateCache protocol ----------------------------------------------------------------
    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.parts.values(), *self.before.values(), *self.saved.values()))

    @property
    def undoable(self) -> int:
        return self.undo_rows

    def read(self) -> dict[str, np.ndarray]:
        return {name: self.parts[name].read().reshape(shape).astype(FLOAT32) for name, shape in self._shapes.items()}

    def write(self, parts: dict[str, np.ndarray]) -> None:
        if {name: np.shape(part) for name, part in parts.items()} != self._shapes:
            raise ValueError(f"a state of {self._shapes}, got {({n: np.shape(p) for n, p in parts.items()})}")
        for name, part in parts.items():
            self.parts[name].write(np.asarray(part, dtype=FLOAT32).reshape(-1))
        self.forget()

    def reset(self) -> None:
        for tensor in self.parts.values():
            tensor.write(np.zeros(tensor.nbytes // FLOAT32.itemsize, dtype=FLOAT32))
        self.forget()

    # ---- taking a verify forward back ---------------------------------------------------------
    def room_for_rows(self, rows: int, widths: dict[str, int]) -> None:
        """Make `saved` hold `rows` rows of each input (width: values per row); the before-parts too."""
        if rows <= self.saved_rows:
            return
        self.saved = {name: self.backend._new_buffer(rows * width * FLOAT32.itemsize, FLOAT32)
                      for name, width in widths.items()}
        self.saved_rows = rows
        self.before = {name: self._new(shape) for name, shape in self._shapes.items()}

    def remember(self, rows: int) -> None:
        """The coming forward is a verify block of `rows` real rows: keep the parts as they are now
        (its kernels save the rows themselves)."""
        self._copy(self.parts, self.before)
        self.undo_rows = rows

    def restore(self) -> None:
        """The parts as they were before the last verify forward."""
        self._copy(self.before, self.parts)
        self.forget()

    def forget(self) -> None:
        self.undo_rows = 0

    def _copy(self, source: dict[str, DeviceTensor], target: dict[str, DeviceTensor]) -> None:
        regions = [(source[name].buffer, 0, target[name].buffer, 0, target[name].nbytes) for name in self._shapes]
        self.backend.arena.copy(regions)


def adopt(backend, name: str, shapes: dict[str, tuple[int, ...]]) -> VulkanStateCache:
    """The device state of op `name`: made zero where absent; where the prefix cache wrote host
    parts before the op first ran (runtime.kv.write_states), those parts moved onto the device."""
    state = backend.state_caches.get(name)
    if isinstance(state, VulkanStateCache):
        return state
    device = VulkanStateCache(backend, shapes)
    if state is None:
        device.reset()
    else:
        device.write(state.read())
    backend.state_caches[name] = device
    return device
