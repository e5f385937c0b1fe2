"""llm.mnn.weight: the external weight file, memory-mapped read-only, every read bounds-checked.

The graph's tables point into this file with `external` lists of int64, [offset, bytes of each
piece...], the pieces of one entry stored back to back from `offset`. A constant (Blob) is
[offset, bytes]; each op family with weights says its own layout and decodes it (mnngpu/ops/).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Self

import numpy as np

from ..errors import WeightFileError


class WeightFile:
    """A read-only view of a weight file. Arrays it returns are views into the mapping, never copies."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as handle:
                self.size = os.fstat(handle.fileno()).st_size
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if self.size else b""
        except OSError as err:
            raise WeightFileError(f"a readable weight file ({err.strerror})", path=self.path) from None

    def check(self, offset: int, length: int, what: str) -> None:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise WeightFileError(f"expected {length} bytes at offset {offset} inside the {self.size}-byte file",
                                  path=self.path, field=what)

    def bytes(self, offset: int, length: int, what: str) -> np.ndarray:
        """`length` raw bytes at `offset`, as a read-only uint8 array."""
        return self.array(offset, "u1", length, what)

    def array(self, offset: int, dtype: str, count: int, what: str) -> np.ndarray:
        """`count` little-endian values of `dtype` at `offset` (read-only view)."""
        self.check(offset, count * np.dtype(dtype).itemsize, what)
        if count == 0:
            return np.zeros(0, dtype=dtype)
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset)

    def close(self) -> None:
        """Unmap, unless arrays still point into the mapping (then it goes when they do)."""
        if isinstance(self._map, mmap.mmap):
            try:
                self._map.close()
            except BufferError:
                pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_floats(weights: WeightFile, offset: int, length: int, what: str) -> np.ndarray | None:
    """`length` bytes of float32 values at `offset` (read-only view); None when `length` is 0."""
    if length == 0:
        return None
    if length % 4:
        raise WeightFileError(f"a whole number of float32 values, got {length} bytes", path=weights.path, field=what)
    return weights.array(offset, "<f4", length // 4, what)
