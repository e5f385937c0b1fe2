"""llm.mnn.weight: the external weight file, memory-mapped read-only, every read bounds-checked.

The graph's tables point into this file with `external` lists of int64:
  Convolution2D (quantized):  [offset, weight_bytes, alpha_bytes, bias_bytes, sparse_index_bytes]
  Convolution2D (float):      [offset, weight_bytes, bias_bytes]
  LayerNorm:                  [offset, gamma_bytes, beta_bytes]
  Blob (a constant):          [offset, bytes]
The pieces of one entry are stored back to back from `offset`.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Self

import numpy as np

from ..errors import WeightFileError
from .params import LayerNorm


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


def read_layernorm(weights: WeightFile | None, ln: LayerNorm,
                   what: str = "LayerNorm") -> tuple[np.ndarray | None, np.ndarray | None]:
    """(gamma, beta) as float32, from `ln.external` in the weight file or from the inline vectors.

    Either is None when the op has none (an RMSNorm export still stores a zero beta).
    """
    if ln.external is None or len(ln.external) < 2:
        return ln.gamma, ln.beta
    if weights is None:
        raise WeightFileError("a weight file: this LayerNorm keeps gamma/beta externally", field=what)
    offset, gamma_bytes = ln.external[0], ln.external[1]
    beta_bytes = ln.external[2] if len(ln.external) > 2 else 0
    gamma = _float_run(weights, offset, gamma_bytes, f"{what}.external[1] (gamma)")
    beta = _float_run(weights, offset + gamma_bytes, beta_bytes, f"{what}.external[2] (beta)")
    if gamma is not None and beta is not None and beta.size != gamma.size:
        raise WeightFileError(f"beta as long as gamma ({gamma.size} floats), got {beta.size}",
                              path=weights.path, field=what)
    return gamma, beta


def _float_run(weights: WeightFile, offset: int, length: int, what: str) -> np.ndarray | None:
    if length == 0:
        return None
    if length % 4:
        raise WeightFileError(f"a whole number of float32 values, got {length} bytes", path=weights.path, field=what)
    return weights.array(offset, "<f4", length // 4, what)
