"""Where every activation of one resized pipeline lives: one arena, offsets planned by lifetime.

At the end of a resize the backend knows its executions in run order and the tensors each reads
and writes (mnngpu.backend.lifetimes). A tensor's bytes are taken when its producer runs and given
back after its last reader, so a 512-token prefill needs a few activations' worth of memory
instead of one buffer per tensor. View ops (reshapes) own no bytes: their output is the input's
buffer, re-shaped.

Tensors nobody reads (graph outputs) keep their bytes until the run ends; the Session
downloads them before the next run. Tensors that no execution here produces (graph inputs,
copies from another backend) get their own buffer; host constants need none.

Arrays can also live in files under tmp_path (`MappedFiles`): the KV cache with `kvcache_mmap`,
the weights the backend converts with `use_mmap`. The OS can write such an array's pages out to
its file and drop them under memory pressure, and read them back on use, instead of holding them
in RAM, as MNN's mmap allocator does. Each file is removed once nothing uses its array any more.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import itertools
import os
import weakref
from pathlib import Path

import numpy as np

from mnngpu.backend import Tensor
from mnngpu.backend.lifetimes import Lifetimes, PlannedStep, lifetimes

ALIGN = 64  # bytes: a cache line, and the widest vector load
MMAP_THRESHOLD = 128 * 1024   # bytes: glibc's own starting value
_M_MMAP_THRESHOLD = -3        # mallopt's parameter number in glibc's malloc.h


@functools.cache   # a process-wide setting: find_library runs a compiler or ldconfig, once is enough
def fix_mmap_threshold() -> bool:
    """Keep glibc's malloc from raising its mmap threshold as arrays are freed.

    By default glibc moves the threshold up to the size of each freed mmapped block (up to 32 MB),
    so later arrays of that size come from the brk heap, whose freed middle is never given back:
    the prefill's temporaries then stay resident through decode and add about 7 MB to the peak
    RSS of a 0.5B model. A fixed threshold sends every array over 128 KB to its own mapping,
    returned to the system when freed. False where the C library has no mallopt (not glibc)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(ctypes.c_int(_M_MMAP_THRESHOLD), ctypes.c_int(MMAP_THRESHOLD)))


class FreeList:
    """First-fit allocator over a growing range of offsets."""

    def __init__(self):
        self.free: list[tuple[int, int]] = []   # (offset, size), sorted by offset
        self.end = 0

    def take(self, size: int) -> int:
        for i, (offset, length) in enumerate(self.free):
            if length >= size:
                self.free[i:i + 1] = [(offset + size, length - size)] if length > size else []
                return offset
        if self.free and self.free[-1][0] + self.free[-1][1] == self.end:
            offset = self.free.pop()[0]     # extend the trailing free block
        else:
            offset = self.end
        self.end = offset + size
        return offset

    def give(self, offset: int, size: int) -> None:
        self.free.append((offset, size))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for start, length in self.free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        self.free = merged


def _aligned(nbytes: int) -> int:
    return max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)


def plan(steps: list[PlannedStep], reuse: bool = True) -> None:
    """Give every tensor the steps touch a `device` array (views: a view of their input's)."""
    found = lifetimes(steps)
    owned = {id(found.root_of(t)): found.root_of(t) for step in steps for t in [*step.inputs, *step.outputs]}
    offsets = _offsets(steps, found, owned) if reuse else {}
    arena = np.empty(max((offset + size for offset, size in offsets.values()), default=0) + ALIGN, dtype=np.uint8)
    shift = (-arena.ctypes.data) % ALIGN
    for key, tensor in owned.items():
        if key in offsets:
            offset, _ = offsets[key]
            start = shift + offset
            tensor.device = arena[start:start + tensor.nbytes].view(tensor.dtype).reshape(tensor.shape)
        elif tensor.device is None and tensor.host is None:
            tensor.device = np.empty(tensor.shape, dtype=tensor.dtype)
    for step in steps:
        if step.view_of is not None:
            source = step.inputs[step.view_of].device
            step.outputs[0].device = np.asarray(source).reshape(step.outputs[0].shape)


def _offsets(steps: list[PlannedStep], found: Lifetimes, owned: dict[int, Tensor]) -> dict[int, tuple[int, int]]:
    """Arena (offset, size) for every root tensor a step here writes."""
    free = FreeList()
    offsets: dict[int, tuple[int, int]] = {}
    dies_after = found.dies_after(found.produced)
    for index, step in enumerate(steps):
        if step.view_of is None:
            for tensor in step.outputs:
                size = _aligned(tensor.nbytes)
                offsets[id(tensor)] = (free.take(size), size)
        for key in dies_after.get(index, []):
            free.give(*offsets[key])
    return {key: value for key, value in offsets.items() if key in owned}


# ---- arrays in files under tmp_path ------------------------------------------------------------
def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


class MappedFiles:
    def __init__(self, folder: str | os.PathLike, kind: str):
        self.folder = Path(folder)
        self.kind = kind   # "kv" or "weight": part of each file's name
        self._numbers = itertools.count()

    def zeros(self, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """A zero-filled array of `shape` in a new file (a new file reads as zeros)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"mnngpu-{self.kind}-{os.getpid()}-{id(self):x}-{next(self._numbers)}.bin"
        array = np.memmap(path, dtype=dtype, mode="w+", shape=shape)
        weakref.finalize(array, _remove, path)
        return array

    def copy(self, values: np.ndarray) -> np.ndarray:
        array = self.zeros(values.shape, values.dtype)
        array[...] = values
        return array


SMALL_WEIGHT_BYTES = 1 << 16   # weights up to this size are copied out of the weight file at load


def owns_memory(array) -> bool:
    """A non-empty array whose bytes are its own or another in-memory array's (no file mapping)."""
    if not isinstance(array, np.ndarray) or array.size == 0:
        return False
    while isinstance(array, np.ndarray):
        if isinstance(array, np.memmap):
            return False
        array = array.base
    return array is None or isinstance(array, bytes | bytearray)


def is_small_file_view(array) -> bool:
    return isinstance(array, np.ndarray) and 0 < array.nbytes <= SMALL_WEIGHT_BYTES and not owns_memory(array)
