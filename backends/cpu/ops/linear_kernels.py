"""numba kernels of the quantized linear layer: decode GEMV over packed codes, prefill dequantization.

A matrix is `codes` uint8 [oc, ic/2] (int4: element 2i in the high nibble) or [oc, ic] (int8),
and `alpha` float32 [oc, n_blocks, 2] holding (min, scale) per (row, block):
    w[o, i] = (code[o, i] + k) * scale[o, b] + min[o, b],   b = i // block
which is the weight file's own asymmetric alpha layout, so both arrays can be views of it.

GEMV per row, with x split into its even and odd elements (xe, xo):
    hi*xe + lo*xo == hi*(xe - 16*xo) + byte*xo,   byte = 16*hi + lo,
so one byte needs a float conversion, a floor and two fused multiply-adds, all 32-bit lanes
(numba widens integer shifts and masks to 64 bits, which halves the vector width).
    y[o] = sum_b scale*dot_b + (k*scale + min) * sum(x in block b)
Indices are unsigned so that numba emits no negative-index wraparound in the inner loops.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from mnngpu.backends.cpu.ops.intrinsics import prefetch

SIXTEENTH = np.float32(0.0625)
HALF_64 = 32                  # bytes per int4 block of 64, the exporter's default block
PREFETCH_BYTES = 2048         # how far ahead of the row being read the codes are prefetched
PREFETCH_ALPHA_ROWS = 8

_KERNEL = dict(fastmath=True, cache=True, nogil=True)


@numba.njit(inline="always", **_KERNEL)
def _q4_bytes(codes, row, base, xd, xo, width):
    dot = np.float32(0.0)
    for j in range(np.uint64(width)):
        byte = np.float32(codes[row, base + j])
        dot += np.floor(byte * SIXTEENTH) * xd[base + j] + byte * xo[base + j]
    return dot


@numba.njit(inline="always", **_KERNEL)
def _q8_bytes(codes, row, base, x, width):
    dot = np.float32(0.0)
    for j in range(np.uint64(width)):
        dot += np.float32(codes[row, base + j]) * x[base + j]
    return dot


@numba.njit(inline="always", **_KERNEL)
def _dot(codes, alpha, k, o, x, xd, xo, xsum, nibbles, width):
    """One row of the matrix times x; `width` code bytes per block."""
    row = np.uint64(o)
    row_bytes = codes.strides[0]
    acc = np.float32(0.0)
    const = np.float32(0.0)
    for b in range(np.uint64(xsum.size)):
        base = b * np.uint64(width)
        prefetch(codes, o * row_bytes + np.int64(base) + PREFETCH_BYTES)
        if nibbles:
            dot = _q4_bytes(codes, row, base, xd, xo, width)
        else:
            dot = _q8_bytes(codes, row, base, x, width)
        scale = alpha[row, b, 1]
        acc += scale * dot
        const += (k * scale + alpha[row, b, 0]) * xsum[b]
    return acc + const


@numba.njit(inline="always", **_KERNEL)
def _row(codes, alpha, k, o, x, xd, xo, xsum, nibbles, block):
    if o + PREFETCH_ALPHA_ROWS < alpha.shape[0]:
        prefetch(alpha, (o + PREFETCH_ALPHA_ROWS) * alpha.strides[0])
        prefetch(alpha, (o + PREFETCH_ALPHA_ROWS) * alpha.strides[0] + 64)
    if not nibbles:
        return _dot(codes, alpha, k, o, x, xd, xo, xsum, False, block)
    if block == 2 * HALF_64:   # the common block: a constant trip count vectorizes fully
        return _dot(codes, alpha, k, o, x, xd, xo, xsum, True, HALF_64)
    return _dot(codes, alpha, k, o, x, xd, xo, xsum, True, block // 2)


@numba.njit(**_KERNEL)
def prepare_x(x, block, nibbles, xd, xo, xsum):
    """Block sums of x, and for int4 its even/odd split as (xe - 16*xo, xo)."""
    for b in range(xsum.size):
        xsum[b] = x[b * block:(b + 1) * block].sum()
    if nibbles:
        for i in range(xd.size):
            xd[i] = x[2 * i] - np.float32(16.0) * x[2 * i + 1]
            xo[i] = x[2 * i + 1]


@numba.njit(parallel=True, **_KERNEL)
def gemv_group(codes_t, alpha_t, k_t, bias_t, add_t, ends, x, nibbles, block, xd, xo, xsum, out_t):
    """Several matrices with the same input x, output rows split over the threads in one launch:
    out_t[m][r] = W_m[r] . x + bias_m[r] + add_m[r] (bias/add skipped when empty)."""
    prepare_x(x, block, nibbles, xd, xo, xsum)
    for g in prange(ends[-1]):
        m = 0
        while g >= ends[m]:
            m += 1
        r = g - (ends[m - 1] if m > 0 else 0)
        value = _row(codes_t[m], alpha_t[m], k_t[m], r, x, xd, xo, xsum, nibbles, block)
        if bias_t[m].size:
            value += bias_t[m][r]
        if add_t[m].size:
            value += add_t[m][r]
        out_t[m][r] = value


@numba.njit(parallel=True, **_KERNEL)
def gemv_gated(codes_t, alpha_t, k_t, bias_t, x, nibbles, block, xd, xo, xsum, out):
    """out[r] = up[r] * silu(gate[r]) with (gate, up) = matrices 0 and 1: MNN's MUL_SILU(up, gate)."""
    prepare_x(x, block, nibbles, xd, xo, xsum)
    for r in prange(out.size):
        gate = _row(codes_t[0], alpha_t[0], k_t[0], r, x, xd, xo, xsum, nibbles, block)
        up = _row(codes_t[1], alpha_t[1], k_t[1], r, x, xd, xo, xsum, nibbles, block)
        if bias_t[0].size:
            gate += bias_t[0][r]
        if bias_t[1].size:
            up += bias_t[1][r]
        out[r] = up * gate / (np.float32(1.0) + np.exp(-gate))


@numba.njit(**_KERNEL)
def dequantize_rows(codes, alpha, k, nibbles, block, start, out):
    """out[r] = float32 weights of row start + r (a tile for the prefill GEMM)."""
    half = block // 2
    for r in range(out.shape[0]):
        o = start + r
        for b in range(alpha.shape[1]):
            scale = alpha[o, b, 1]
            low = k * scale + alpha[o, b, 0]
            if nibbles:
                for j in range(half):
                    byte = np.float32(codes[o, b * half + j])
                    hi = np.floor(byte * SIXTEENTH)
                    out[r, b * block + 2 * j] = hi * scale + low
                    out[r, b * block + 2 * j + 1] = (byte - np.float32(16.0) * hi) * scale + low
            else:
                for j in range(block):
                    out[r, b * block + j] = np.float32(codes[o, b * block + j]) * scale + low


@numba.njit(**_KERNEL)
def mul_silu(up, gate, out):
    """out = up * silu(gate), elementwise over equal-shaped 2-D arrays."""
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            g = gate[i, j]
            out[i, j] = up[i, j] * g / (np.float32(1.0) + np.exp(-g))
