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

precision low runs int4 matrices in the lane-group layout of lane_kernels.py instead.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from mnngpu import jit
from mnngpu.backends.cpu.kernels import fastmath
from mnngpu.backends.cpu.kernels.intrinsics import PREFETCH_BYTES, prefetch

SIXTEENTH = np.float32(0.0625)
HALF_64 = 32                  # bytes per int4 block of 64, the exporter's default block
PREFETCH_ALPHA_ROWS = 8

_KERNEL = {"fastmath": True, "cache": True, "nogil": True}
# The one-thread GEMVs are compiled with parallel=True too, though they have no prange: numba's
# parallel pipeline makes this row code twice as fast (measured), for no launch cost. Numba warns
# that nothing was parallelized; `jit.compile_now` compiles them with that warning silenced.
_SERIAL_GEMV = {"parallel": True, **_KERNEL}


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
    alpha_ahead = (o + PREFETCH_ALPHA_ROWS) * alpha.strides[0]
    acc = np.float32(0.0)
    const = np.float32(0.0)
    for b in range(np.uint64(xsum.size)):
        base = b * np.uint64(width)
        prefetch(codes, o * row_bytes + np.int64(base) + PREFETCH_BYTES)
        if b % 8 == 0:   # one cache line of a later row's (min, scale) pairs
            prefetch(alpha, alpha_ahead + np.int64(b) * 8)
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
    if not nibbles:
        return _dot(codes, alpha, k, o, x, xd, xo, xsum, False, block)
    if block == 2 * HALF_64:   # the common block: a constant trip count vectorizes fully
        return _dot(codes, alpha, k, o, x, xd, xo, xsum, True, HALF_64)
    return _dot(codes, alpha, k, o, x, xd, xo, xsum, True, block // 2)


@numba.njit(inline="always", **_KERNEL)
def _span_rows(codes, alpha, k, bias, start, stop, xs, nibbles, block, xds, xos, xsums, out):
    """Rows start..stop-1 of the matrix times every row i of xs, into out[i, r]: each row of x over
    the span in turn, in the one-row GEMV's own code, so each gives the bits it gives alone (LLVM
    vectorizes a loop shared by the rows differently); the span's weight rows stay in cache from
    one row of x to the next."""
    for i in range(xs.shape[0]):
        x, xd, xo, xsum = xs[i], xds[i], xos[i], xsums[i]
        for r in range(start, stop):
            value = _row(codes, alpha, k, r, x, xd, xo, xsum, nibbles, block)
            out[i, r] = value + bias[r] if bias.size else value


@numba.njit(**_KERNEL)
def prepare_x(x, block, nibbles, xd, xo, xsum):
    """Block sums of x; for int4 its even/odd split as (xe - 16*xo, xo)."""
    for b in range(xsum.size):
        xsum[b] = x[b * block:(b + 1) * block].sum()
    if nibbles:
        for i in range(xd.size):
            xd[i] = x[2 * i] - np.float32(16.0) * x[2 * i + 1]
            xo[i] = x[2 * i + 1]


def row_buffers(rows: int, ic: int, block: int) -> tuple:
    """prepare_x's outputs for `rows` rows of x: (xd, xo, xsum), each [rows, ...]."""
    return (np.empty((rows, ic // 2), dtype=np.float32), np.empty((rows, ic // 2), dtype=np.float32),
            np.empty((rows, ic // block), dtype=np.float32))


@numba.njit(inline="always", **_KERNEL)
def _group_span(item, codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, out_t):
    """Rows spans[item, 1] <= r < spans[item, 2] of member spans[item, 0]."""
    m = spans[item, 0]
    codes, alpha, k, bias, out = codes_t[m], alpha_t[m], k_t[m], bias_t[m], out_t[m]
    for r in range(spans[item, 1], spans[item, 2]):
        value = _row(codes, alpha, k, r, x, xd, xo, xsum, nibbles, block)
        out[r] = value + bias[r] if bias.size else value


@numba.njit(parallel=True, **_KERNEL)
def gemv_group(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, out_t):
    """Several matrices with the same input x in one launch, out_t[m] = W_m . x + bias_m, the work
    split into spans of rows (member, first, end) over the threads."""
    prepare_x(x, block, nibbles, xd, xo, xsum)
    for item in prange(spans.shape[0]):
        _group_span(item, codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, out_t)


@numba.njit(**_SERIAL_GEMV)
def gemv_group_serial(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, out_t):
    """gemv_group on the calling thread: for matrices too small to repay a parallel launch."""
    prepare_x(x, block, nibbles, xd, xo, xsum)
    for item in range(spans.shape[0]):
        _group_span(item, codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, out_t)


@numba.njit(inline="always", **_KERNEL)
def _prepare_rows(xs, block, nibbles, xds, xos, xsums):
    for i in range(xs.shape[0]):
        prepare_x(xs[i], block, nibbles, xds[i], xos[i], xsums[i])


@numba.njit(inline="always", **_KERNEL)
def _group_span_rows(item, codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums,
                     out_t):
    """_group_span for every row i of xs, out_t[m] [rows, oc]: the span's weight rows stay in cache."""
    m = spans[item, 0]
    _span_rows(codes_t[m], alpha_t[m], k_t[m], bias_t[m], spans[item, 1], spans[item, 2], xs, nibbles, block, xds,
               xos, xsums, out_t[m])


@numba.njit(parallel=True, **_KERNEL)
def gemv_rows_group(codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums, out_t):
    """gemv_group for a few rows of x (xs [rows, ic], per-row buffers, out_t[m] [rows, oc]): each
    span of weight rows is read from memory once and every row of x passes over it while it is
    in cache, so a verify block costs little more than one decode step."""
    _prepare_rows(xs, block, nibbles, xds, xos, xsums)
    for item in prange(spans.shape[0]):
        _group_span_rows(item, codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums,
                         out_t)


@numba.njit(**_SERIAL_GEMV)
def gemv_rows_group_serial(codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums,
                           out_t):
    _prepare_rows(xs, block, nibbles, xds, xos, xsums)
    for item in range(spans.shape[0]):
        _group_span_rows(item, codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums,
                         out_t)


def row_spans(rows: list[int], per_span: int = 64) -> np.ndarray:
    """int64 [n, 3] (member, first row, end row) covering every member's rows, per_span at a time."""
    return np.array([(m, start, min(count, start + per_span)) for m, count in enumerate(rows)
                     for start in range(0, count, per_span)], dtype=np.int64).reshape(-1, 3)


@numba.njit(**_KERNEL)
def mul_silu(up, gate, out):
    """out = up * silu(gate), elementwise over equal-shaped 2-D arrays, a row at a time."""
    for i in range(out.shape[0]):
        fastmath.silu_times(up[i], gate[i], out[i])


@numba.njit(parallel=True, **_KERNEL)
def gemv_gated(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, out_t, out):
    """out = up * silu(gate) with out_t = (gate, up) = matrices 0 and 1 times x (gemv_group): MNN's
    MUL_SILU(up, gate). Each thread streams one run of rows; a thread that went from gate rows to
    up rows and back read 12% slower (measured), and SiLU row by row beside the GEMV a further 10%."""
    prepare_x(x, block, nibbles, xd, xo, xsum)
    for item in prange(spans.shape[0]):
        _group_span(item, codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, out_t)
    fastmath.silu_times(out_t[1], out_t[0], out)


@numba.njit(**_SERIAL_GEMV)
def gemv_gated_serial(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, out_t, out):
    prepare_x(x, block, nibbles, xd, xo, xsum)
    for item in range(spans.shape[0]):
        _group_span(item, codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, out_t)
    fastmath.silu_times(out_t[1], out_t[0], out)


@numba.njit(parallel=True, **_KERNEL)
def gemv_rows_gated(codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums, out_t,
                    out):
    """gemv_gated for a few rows of x (out_t and out [rows, oc]), each span of weights shared by the
    rows; each row's SiLU is the one-row call's (mul_silu), so it gives the same bits."""
    _prepare_rows(xs, block, nibbles, xds, xos, xsums)
    for item in prange(spans.shape[0]):
        _group_span_rows(item, codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums,
                         out_t)
    mul_silu(out_t[1], out_t[0], out)


@numba.njit(**_SERIAL_GEMV)
def gemv_rows_gated_serial(codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums,
                           out_t, out):
    _prepare_rows(xs, block, nibbles, xds, xos, xsums)
    for item in range(spans.shape[0]):
        _group_span_rows(item, codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums,
                         out_t)
    mul_silu(out_t[1], out_t[0], out)


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


# ---- numpy twins: the stand-ins while the kernels above compile (mnngpu/jit.py) -----------------

TWIN_ROWS = 2048   # rows dequantized at a time: a bounded float32 copy, whatever the matrix


def dequantized(codes, alpha, k, nibbles, block, start, stop) -> np.ndarray:
    """float32 rows [start, stop) of a packed matrix (the layout in this module's docstring)."""
    packed = codes[start:stop]
    if nibbles:
        q = np.empty((packed.shape[0], 2 * packed.shape[1]), dtype=np.float32)
        q[:, 0::2] = packed >> 4
        q[:, 1::2] = packed & 15
    else:
        q = packed.astype(np.float32)
    q = q.reshape(packed.shape[0], -1, block)
    scales = alpha[start:stop]
    return ((q + k) * scales[:, :, 1:2] + scales[:, :, 0:1]).reshape(packed.shape[0], -1)


def _matrix_times_x(codes, alpha, k, bias, x, nibbles, block, out) -> None:
    """out [..., oc] = x [..., ic] times the matrix, plus bias: one row of x or several."""
    oc = out.shape[-1]
    for start in range(0, oc, TWIN_ROWS):
        stop = min(oc, start + TWIN_ROWS)
        out[..., start:stop] = x @ dequantized(codes, alpha, k, nibbles, block, start, stop).T
    if bias.size:
        out += bias


@jit.twin_of(gemv_group)
@jit.twin_of(gemv_group_serial)
@jit.twin_of(gemv_rows_group)
@jit.twin_of(gemv_rows_group_serial)
def gemv_group_numpy(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, out_t):
    """Every member in full (the spans split the same rows for the threads); x in float32, one row
    [ic] (gemv_group) or a few [rows, ic] (gemv_rows_group)."""
    for m in range(len(codes_t)):
        _matrix_times_x(codes_t[m], alpha_t[m], k_t[m], bias_t[m], x, nibbles, block, out_t[m])


@jit.twin_of(gemv_gated)
@jit.twin_of(gemv_gated_serial)
@jit.twin_of(gemv_rows_gated)
@jit.twin_of(gemv_rows_gated_serial)
def gemv_gated_numpy(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, out_t, out):
    gemv_group_numpy(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, out_t)
    fastmath.silu_times_numpy(out_t[1], out_t[0], out)


@jit.twin_of(dequantize_rows)
def dequantize_rows_numpy(codes, alpha, k, nibbles, block, start, out):
    out[:] = dequantized(codes, alpha, k, nibbles, block, start, start + out.shape[0])


jit.twin_of(mul_silu)(fastmath.silu_times_numpy)
