"""Arrays kept in files under tmp_path: the KV cache with `kvcache_mmap`, the weights the CPU
backend converts with `use_mmap`.

The OS can write such an array's pages out to its file and drop them under memory pressure, and
read them back on use, instead of holding them in RAM, as MNN's mmap allocator does. Each file
is removed once nothing uses its array any more.
"""

from __future__ import annotations

import itertools
import os
import weakref
from pathlib import Path

import numpy as np


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
