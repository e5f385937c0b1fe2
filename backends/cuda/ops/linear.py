"""1x1 Convolution as a linear layer over weights kept quantized on the device.

Decode (one row) runs a GEMV kernel straight over the packed codes: one warp per output row,
fp32 accumulation, so its launch is fixed and goes into the decode CUDA graph. A batched decode
module (rows of several sequences, up to MAX_GEMV_TOKENS) runs the GEMV's *_tokens twin, which
reads each weight once for every row and gives each row a lone decode step's values. Prefill (many
rows) dequantizes a tile of rows at a time into a shared scratch of gemm_t (fp16 for fp16
storage, else fp32) and multiplies with cuBLAS into another scratch, fp32 accumulation; the
bias is added when the result is converted back to the storage type. Through
backends/cuda/cublas.py that GEMM goes into the prefill module's CUDA graph too; where that
cannot be had it runs through cupy.matmul, launch by launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mnngpu.backends.cuda.device import BLOCK, grid_for
from mnngpu.backends.cuda.ops.base import CUDAExecution

ROWS_PER_BLOCK = 8        # warps of a 256-thread GEMV block (linear.cu)
MAX_GEMV_TOKENS = 8       # rows of x a *_tokens GEMV takes (linear.cu MAX_TOKENS)
TILE_ELEMENTS = 1 << 25   # dequantized weights per prefill tile (128 MB at fp32)


@dataclass
class DeviceLinear:
    oc: int
    ic: int
    kind: str            # "q4" (two codes a byte), "q8" (one code a byte), "dense" (real_t weights)
    block_size: int
    row_bytes: int
    codes: Any           # uint8 [oc * row_bytes]
    scales: Any          # float32 [oc * n_blocks]
    zeros: Any
    bias: Any            # float32 [oc] or None
    dense: Any = None    # storage dtype [oc * ic]

    @property
    def n_blocks(self) -> int:
        return self.ic // self.block_size


def pack_linear(backend, weight) -> DeviceLinear:
    """Upload a QuantizedLinear: codes as they are, scales and zeros fp32, or dense weights."""
    device = backend.device
    bias = None if weight.bias is None else device.to_device(np.asarray(weight.bias, dtype=np.float32))
    if not weight.is_quantized:
        dense = device.to_device(backend.storage.to_storage(np.asarray(weight.float_weight)).reshape(-1))
        return DeviceLinear(weight.oc, weight.ic, "dense", weight.ic, 0, None, None, None, bias, dense)
    codes = weight.codes if weight.bits in (4, 8) else weight.unpacked_codes()
    kind = "q4" if weight.bits == 4 else "q8"
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    return DeviceLinear(weight.oc, weight.ic, kind, weight.block_size, codes.shape[1],
                        device.to_device(codes.reshape(-1)),
                        device.to_device(np.ascontiguousarray(weight.scales, dtype=np.float32).reshape(-1)),
                        device.to_device(np.ascontiguousarray(weight.zeros, dtype=np.float32).reshape(-1)), bias)


def gemv_kernel(w: DeviceLinear) -> str:
    """The 32-bit-word kernels need whole words of codes that share one block."""
    if w.kind == "dense":
        return "gemv_dense"
    per_word = 8 if w.kind == "q4" else 4
    words = w.ic % per_word == 0 and w.block_size % per_word == 0 and w.row_bytes % 4 == 0
    return f"gemv_{w.kind}_words" if words else f"gemv_{w.kind}"


class CUDALinear(CUDAExecution):
    @classmethod
    def pack(cls, backend, node):
        if "weight" in node.weights:
            node.weights["cuda"] = pack_linear(backend, node.weights.pop("weight"))

    @classmethod
    def decline(cls, inputs, outputs, node):
        return None if "cuda" in node.weights else "its weights were not packed for CUDA"

    def onResize(self, inputs, outputs):
        w: DeviceLinear = self.node.weights["cuda"]
        self.w = w
        self.rows = inputs[0].size // w.ic
        self.x, self.out = self.backend._buffer(inputs[0]), self.backend._buffer(outputs[0])
        # a batched decode module is resized inside a batched forward
        self.gemv = self.rows == 1 or (self.backend.batch is not None and self.rows <= MAX_GEMV_TOKENS)
        if self.gemv:
            self._prepare_gemv()
        else:
            self.capturable = self.backend.device.cublas is not None

    def _prepare_gemv(self) -> None:
        w, backend = self.w, self.backend
        bias = (backend._or_placeholder(w.bias), np.int32(w.bias is not None))
        grid = (-(-w.oc // ROWS_PER_BLOCK),)
        oc, ic = np.int32(w.oc), np.int32(w.ic)
        if w.kind == "dense":
            args = (oc, ic, w.dense, *bias, self.x, self.out)
        else:
            args = (oc, ic, np.int32(w.row_bytes), np.int32(w.block_size), np.int32(w.n_blocks),
                    w.codes, w.scales, w.zeros, *bias, self.x, self.out)
        if self.rows == 1:
            self.prepare("linear.cu", gemv_kernel(w), grid, (BLOCK,), args)
        else:
            self.prepare("linear.cu", f"{gemv_kernel(w)}_tokens", grid, (BLOCK,), (np.int32(self.rows), *args))

    def launch(self) -> None:
        if self.gemv:
            super().launch()
        else:
            self._gemm()

    def _gemm(self) -> None:
        """out[rows, oc] = x[rows, ic] @ W^T + bias, W dequantized a tile of rows at a time."""
        w, backend, device = self.w, self.backend, self.backend.device
        gemm_dtype = backend.storage.gemm_dtype
        rows, oc, ic = self.rows, w.oc, w.ic
        tile_rows = max(1, min(oc, TILE_ELEMENTS // ic))
        x = backend._scratch("linear.x", rows * ic, gemm_dtype)
        y = backend._scratch("linear.y", rows * oc, gemm_dtype)
        tile = backend._scratch("linear.w", tile_rows * ic, gemm_dtype)
        self.scratch_used = (x, y, tile)   # a captured graph points at these: they must outlive it
        kernel = device.kernel
        self._run(kernel("linear.cu", "real_to_gemm"), rows * ic, (np.int32(rows * ic), self.x, x))
        for start in range(0, oc, tile_rows):
            count = min(tile_rows, oc - start)
            self._dequantize(start, count, tile)
            self._multiply(x, tile, y, start, count)
        self._run(kernel("linear.cu", "gemm_to_real"), rows * oc,
                  (np.int32(rows), np.int32(oc), y, backend._or_placeholder(w.bias),
                   np.int32(w.bias is not None), self.out))

    def _multiply(self, x, tile, y, start: int, count: int) -> None:
        """y[:, start: start + count] = x @ tile[:count].T, through cuBLAS."""
        device, rows, oc, ic = self.backend.device, self.rows, self.w.oc, self.w.ic
        if device.cublas is not None:
            device.cublas.rows_times_weights(x, tile, rows, count, ic, y, start, oc)
            return
        y2 = y[: rows * oc].reshape(rows, oc)
        with device.stream:
            y2[:, start: start + count] = device.cp.matmul(x[: rows * ic].reshape(rows, ic),
                                                           tile[: count * ic].reshape(count, ic).T)

    def _dequantize(self, start: int, count: int, tile) -> None:
        w, kernel = self.w, self.backend.device.kernel
        n = count * w.ic
        if w.kind == "dense":
            self._run(kernel("linear.cu", "dense_to_gemm"), n, (np.int32(start), np.int32(count), np.int32(w.ic),
                                                                w.dense, tile))
            return
        self._run(kernel("linear.cu", f"dequant_{w.kind}"), n,
                  (np.int32(start), np.int32(count), np.int32(w.ic), np.int32(w.row_bytes), np.int32(w.block_size),
                   np.int32(w.n_blocks), w.codes, w.scales, w.zeros, tile))

    def _run(self, kernel, n: int, args: tuple) -> None:
        device = self.backend.device
        with device.stream:
            kernel(grid_for(n), (BLOCK,), args)


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"Convolution": CUDALinear}
