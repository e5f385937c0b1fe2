"""How float tensors are stored on the device: fp32 at precision high, else fp16 (or bf16).

Host values are always float32; `to_storage` / `from_storage` convert at upload and download.
bf16 has no numpy or cupy dtype, so it is stored as its raw uint16 bit patterns, which the
kernels (shaders/cuda/common.cuh, STORAGE=2) read as the high half of an fp32.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from mnngpu.backend import BackendConfig
from mnngpu.errors import ConfigError

HALF_ENV = "MNNGPU_CUDA_HALF"  # fp16 (default) or bf16: the storage under precision low/normal


@dataclass(frozen=True)
class Storage:
    name: str            # "fp32", "fp16", "bf16"
    define: int          # STORAGE in common.cuh
    dtype: np.dtype      # the device arrays' dtype
    gemm_dtype: np.dtype  # gemm_t: the element type of the prefill cupy.matmul

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def format(self) -> str:
        """The float format's full name, as Capabilities.storage spells it."""
        return {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[self.name]

    def to_storage(self, values: np.ndarray) -> np.ndarray:
        values = np.ascontiguousarray(values, dtype=np.float32)
        if self.name == "bf16":
            return float32_to_bf16_bits(values)
        return values.astype(self.dtype, copy=False)

    def from_storage(self, stored: np.ndarray) -> np.ndarray:
        if self.name == "bf16":
            return (np.asarray(stored, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        return np.asarray(stored).astype(np.float32, copy=False)


FP32 = Storage("fp32", 0, np.dtype(np.float32), np.dtype(np.float32))
FP16 = Storage("fp16", 1, np.dtype(np.float16), np.dtype(np.float16))
BF16 = Storage("bf16", 2, np.dtype(np.uint16), np.dtype(np.float32))
HALVES = {"fp16": FP16, "bf16": BF16}


def float32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round to nearest even, as the kernels' from_float does; NaN stays a quiet NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def storage_for(config: BackendConfig) -> Storage:
    if config.precision == "high":
        return FP32
    half = os.environ.get(HALF_ENV, "fp16")
    if half not in HALVES:
        raise ConfigError(f"one of {sorted(HALVES)}, got '{half}'", field=HALF_ENV)
    return HALVES[half]
