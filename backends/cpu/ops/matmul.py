"""1x1 Convolution as a linear layer over quantized weights kept packed in memory.

Decode (one row) runs a fused numba GEMV straight over the packed codes:
    y[o] = sum_b scale[o,b] * (q[o, block b] . x[block b]) + zero[o,b] * sum(x[block b])
Prefill (many rows) dequantizes a tile of output rows at a time into a reused float32
buffer and multiplies with numpy's BLAS, so no float copy of the whole weight ever exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from mnngpu.backend import Execution

TILE_BYTES = 1 << 20  # float32 tile of dequantized rows for the prefill GEMM


@dataclass
class PackedLinear:
    oc: int
    ic: int
    block_size: int
    nibbles: bool            # True: two 4-bit codes per byte, high nibble first
    codes: np.ndarray | None  # uint8 [oc, ic//2] (nibbles) or [oc, ic]
    scales: np.ndarray | None  # float32 [oc, n_blocks]
    zeros: np.ndarray | None
    bias: np.ndarray | None   # float32 [oc]
    dense: np.ndarray | None = None  # float32 [oc, ic] for unquantized weights


def pack_linear(weight) -> PackedLinear:
    """CPU layout: the decoder's arrays as they are (the file's own order serves the kernel)."""
    bias = None if weight.bias is None else np.ascontiguousarray(weight.bias, dtype=np.float32)
    if weight.bits > 8:
        return PackedLinear(weight.oc, weight.ic, weight.ic, False, None, None, None, bias,
                            dense=np.ascontiguousarray(weight.float_weight, dtype=np.float32))
    nibbles = weight.bits == 4
    codes = weight.codes if weight.bits in (4, 8) else weight.unpacked_codes()
    return PackedLinear(weight.oc, weight.ic, weight.block_size, nibbles, np.ascontiguousarray(codes),
                        np.ascontiguousarray(weight.scales, dtype=np.float32),
                        np.ascontiguousarray(weight.zeros, dtype=np.float32), bias)


@numba.njit(parallel=True, cache=True, fastmath=False)
def _gemv_q4(codes, scales, zeros, x, block_sums, block_size, out):
    oc, n_blocks = scales.shape
    half = block_size // 2
    for o in numba.prange(oc):
        acc = 0.0
        for b in range(n_blocks):
            dot = 0.0
            base = b * half
            for j in range(half):
                byte = codes[o, base + j]
                dot += (byte >> 4) * x[2 * (base + j)] + (byte & 15) * x[2 * (base + j) + 1]
            acc += scales[o, b] * dot + zeros[o, b] * block_sums[b]
        out[o] = acc


@numba.njit(parallel=True, cache=True, fastmath=False)
def _gemv_q8(codes, scales, zeros, x, block_sums, block_size, out):
    oc, n_blocks = scales.shape
    for o in numba.prange(oc):
        acc = 0.0
        for b in range(n_blocks):
            dot = 0.0
            base = b * block_size
            for i in range(block_size):
                dot += codes[o, base + i] * x[base + i]
            acc += scales[o, b] * dot + zeros[o, b] * block_sums[b]
        out[o] = acc


@numba.njit(parallel=True, cache=True)
def _dequant_rows(codes, scales, zeros, block_size, nibbles, start, stop, out):
    ic = out.shape[1]
    for r in numba.prange(stop - start):
        o = start + r
        for i in range(ic):
            if nibbles:
                byte = codes[o, i >> 1]
                q = (byte >> 4) if (i & 1) == 0 else (byte & 15)
            else:
                q = codes[o, i]
            b = i // block_size
            out[r, i] = q * scales[o, b] + zeros[o, b]


def linear(w: PackedLinear, x: np.ndarray) -> np.ndarray:
    """x float32 [rows, ic] -> [rows, oc]."""
    rows = x.shape[0]
    if w.dense is not None:
        y = x @ w.dense.T
    elif rows == 1:
        xv = np.ascontiguousarray(x[0], dtype=np.float32)
        sums = xv.reshape(-1, w.block_size).sum(axis=1)
        y = np.empty((1, w.oc), dtype=np.float32)
        kernel = _gemv_q4 if w.nibbles else _gemv_q8
        kernel(w.codes, w.scales, w.zeros, xv, sums, w.block_size, y[0])
    else:
        y = np.empty((rows, w.oc), dtype=np.float32)
        tile_rows = max(1, min(w.oc, TILE_BYTES // (4 * w.ic)))
        tile = np.empty((tile_rows, w.ic), dtype=np.float32)
        for start in range(0, w.oc, tile_rows):
            stop = min(w.oc, start + tile_rows)
            part = tile[: stop - start]
            _dequant_rows(w.codes, w.scales, w.zeros, w.block_size, w.nibbles, start, stop, part)
            np.matmul(x, part.T, out=y[:, start:stop])
    if w.bias is not None:
        y += w.bias
    return y


class CPULinear(Execution):
    def onExecute(self, inputs, outputs):  # noqa: N802
        w: PackedLinear = self.node.weights["packed"]
        x = np.ascontiguousarray(inputs[0].device, dtype=np.float32).reshape(-1, w.ic)
        outputs[0].device = linear(w, x).reshape(outputs[0].shape)
