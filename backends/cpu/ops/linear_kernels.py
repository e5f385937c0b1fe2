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

precision low: x is quantized to int16 per chunk of 64 (step max|x|/32767, far finer than the
int4 weights) and a weight row's dot is int16 dot-product instructions with float vector
accumulators (intrinsics.row_u4_s16). int8 activations (one unsigned-by-signed byte dot product
per 64 weights instead of two int16 ones) were measured and not taken: symmetric int8 per chunk
of 64 put the decode logits 12-47% of their std from MNN's exact ones on three fixtures and the
bench model, more than MNN's own memory-low int8 path (7-29%), for a GEMV only 5-15% faster (one
row) and 15-25% faster (four rows) on an AVX512-VNNI Zen 4, where the row loop is bound by its
float work, not by the dot instructions.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from mnngpu import jit
from mnngpu.backends.cpu.ops import fastmath
from mnngpu.backends.cpu.ops.intrinsics import (
    PREFETCH_BYTES,
    prefetch,
    row2_u4_s16,
    row3_u4_s16,
    row4_u4_s16,
    row_u4_s16,
)

SIXTEENTH = np.float32(0.0625)
HALF_64 = 32                  # bytes per int4 block of 64, the exporter's default block
QUANT_CHUNK = 64              # activations per int16 step (intrinsics.row_u4_s16's chunk)
QUANT_LEVELS = np.float32(32767.0)
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
def _dot_quantized(codes, alpha, k, o, xq, xscale, xsum, block):
    """One int4 row times x quantized to int16 (xq, xscale per chunk of QUANT_CHUNK)."""
    return row_u4_s16(codes, o * codes.strides[0], alpha, o * (alpha.strides[0] // 4), k, block // QUANT_CHUNK,
                      xsum.size, xq, xscale, xsum)


@numba.njit(inline="always", **_KERNEL)
def _row(codes, alpha, k, o, x, xd, xo, xsum, nibbles, block, xq, xscale):
    if xq.size:
        return _dot_quantized(codes, alpha, k, o, xq, xscale, xsum, block)
    if not nibbles:
        return _dot(codes, alpha, k, o, x, xd, xo, xsum, False, block)
    if block == 2 * HALF_64:   # the common block: a constant trip count vectorizes fully
        return _dot(codes, alpha, k, o, x, xd, xo, xsum, True, HALF_64)
    return _dot(codes, alpha, k, o, x, xd, xo, xsum, True, block // 2)


ROW_GROUP = 4   # rows of x that share one decoding of a weight row at precision low (row4_u4_s16's width)


@numba.njit(inline="always", **_KERNEL)
def _dot4_quantized(codes, alpha, k, o, xqs, xscales, xsums, i, block):
    """_dot_quantized for rows i..i+3 of x (a tuple of four): the weight row decoded once."""
    return row4_u4_s16(codes, o * codes.strides[0], alpha, o * (alpha.strides[0] // 4), k, block // QUANT_CHUNK,
                       xsums.shape[1], xqs, xscales, xsums, i)


@numba.njit(inline="always", **_KERNEL)
def _quantized_rows(codes, alpha, k, bias, r, xs, block, xqs, xscales, xsums, out):
    """Row r of an int4 matrix times every row i of xs at precision low, plus bias[r], into
    out[i, r]: ROW_GROUP rows of x at a time, and the two or three left over, share the
    decoding of the weight row, each row's result the bits it has alone (intrinsics._row_sums)."""
    extra = bias[r] if bias.size else np.float32(0.0)
    rows = xs.shape[0]
    grouped = rows - rows % ROW_GROUP
    for i in range(0, grouped, ROW_GROUP):
        v0, v1, v2, v3 = _dot4_quantized(codes, alpha, k, r, xqs, xscales, xsums, i, block)
        out[i, r] = v0 + extra
        out[i + 1, r] = v1 + extra
        out[i + 2, r] = v2 + extra
        out[i + 3, r] = v3 + extra
    left = rows - grouped
    if left == 3:
        v0, v1, v2 = row3_u4_s16(codes, r * codes.strides[0], alpha, r * (alpha.strides[0] // 4), k,
                                 block // QUANT_CHUNK, xsums.shape[1], xqs, xscales, xsums, grouped)
        out[grouped, r] = v0 + extra
        out[grouped + 1, r] = v1 + extra
        out[grouped + 2, r] = v2 + extra
    elif left == 2:
        v0, v1 = row2_u4_s16(codes, r * codes.strides[0], alpha, r * (alpha.strides[0] // 4), k,
                             block // QUANT_CHUNK, xsums.shape[1], xqs, xscales, xsums, grouped)
        out[grouped, r] = v0 + extra
        out[grouped + 1, r] = v1 + extra
    elif left == 1:
        value = _dot_quantized(codes, alpha, k, r, xqs[grouped], xscales[grouped], xsums[grouped], block)
        out[grouped, r] = value + extra


@numba.njit(inline="always", **_KERNEL)
def _float_rows(codes, alpha, k, bias, start, stop, xs, nibbles, block, xds, xos, xsums, xqs, xscales, out):
    """Rows start..stop-1 of the matrix times every row i of xs in float32 (int8 weights, or
    precision normal and high), into out[i, r]: each row of x over the span in turn, in the
    one-row GEMV's own code, so each gives the bits it gives alone (LLVM vectorizes a loop shared
    by the rows differently); the span's weight rows stay in cache from one row of x to the next."""
    for i in range(xs.shape[0]):
        x, xd, xo, xsum, xq, xscale = xs[i], xds[i], xos[i], xsums[i], xqs[i], xscales[i]   # xq, xscale: empty
        for r in range(start, stop):
            value = _row(codes, alpha, k, r, x, xd, xo, xsum, nibbles, block, xq, xscale)
            out[i, r] = value + bias[r] if bias.size else value


@numba.njit(inline="always", **_KERNEL)
def _span_rows(codes, alpha, k, bias, start, stop, xs, nibbles, block, xds, xos, xsums, xqs, xscales, out):
    """Rows start..stop-1 of the matrix times every row of xs (_quantized_rows or _float_rows)."""
    if xqs.shape[1]:
        for r in range(start, stop):
            _quantized_rows(codes, alpha, k, bias, r, xs, block, xqs, xscales, xsums, out)
    else:
        _float_rows(codes, alpha, k, bias, start, stop, xs, nibbles, block, xds, xos, xsums, xqs, xscales, out)


@numba.njit(**_KERNEL)
def prepare_x(x, block, nibbles, xd, xo, xsum, xq, xscale):
    """Block sums of x; for int4 its even/odd split as (xe - 16*xo, xo); when xq is not empty,
    x as int16 per chunk of 64: xq [even 32 | odd 32] per chunk, xscale the chunk's step."""
    for b in range(xsum.size):
        xsum[b] = x[b * block:(b + 1) * block].sum()
    if xq.size:
        for c in range(xscale.size):
            chunk = x[c * QUANT_CHUNK:(c + 1) * QUANT_CHUNK]
            peak = np.abs(chunk).max()
            step = peak / QUANT_LEVELS if peak > 0 else np.float32(1.0)
            xscale[c] = step
            inverse = np.float32(1.0) / step
            half = QUANT_CHUNK // 2
            for j in range(half):
                xq[c * QUANT_CHUNK + j] = np.int16(np.rint(chunk[2 * j] * inverse))
                xq[c * QUANT_CHUNK + half + j] = np.int16(np.rint(chunk[2 * j + 1] * inverse))
    elif nibbles:
        for i in range(xd.size):
            xd[i] = x[2 * i] - np.float32(16.0) * x[2 * i + 1]
            xo[i] = x[2 * i + 1]


def row_buffers(rows: int, ic: int, block: int, quantized: bool) -> tuple:
    """prepare_x's outputs for `rows` rows of x: (xd, xo, xsum, xq, xscale), each [rows, ...];
    xq and xscale are empty unless x is quantized (precision low)."""
    return (np.empty((rows, ic // 2), dtype=np.float32), np.empty((rows, ic // 2), dtype=np.float32),
            np.empty((rows, ic // block), dtype=np.float32),
            np.empty((rows, ic if quantized else 0), dtype=np.int16),
            np.empty((rows, ic // QUANT_CHUNK if quantized else 0), dtype=np.float32))


@numba.njit(inline="always", **_KERNEL)
def _group_span(item, codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, xq, xscale, out_t):
    """Rows spans[item, 1] <= r < spans[item, 2] of member spans[item, 0]."""
    m = spans[item, 0]
    codes, alpha, k, bias, out = codes_t[m], alpha_t[m], k_t[m], bias_t[m], out_t[m]
    for r in range(spans[item, 1], spans[item, 2]):
        value = _row(codes, alpha, k, r, x, xd, xo, xsum, nibbles, block, xq, xscale)
        out[r] = value + bias[r] if bias.size else value


@numba.njit(parallel=True, **_KERNEL)
def gemv_group(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, xq, xscale, out_t):
    """Several matrices with the same input x in one launch, out_t[m] = W_m . x + bias_m, the work
    split into spans of rows (member, first, end) over the threads."""
    prepare_x(x, block, nibbles, xd, xo, xsum, xq, xscale)
    for item in prange(spans.shape[0]):
        _group_span(item, codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, xq, xscale, out_t)


@numba.njit(**_SERIAL_GEMV)
def gemv_group_serial(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, xq, xscale, out_t):
    """gemv_group on the calling thread: for matrices too small to repay a parallel launch."""
    prepare_x(x, block, nibbles, xd, xo, xsum, xq, xscale)
    for item in range(spans.shape[0]):
        _group_span(item, codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, xq, xscale, out_t)


@numba.njit(inline="always", **_KERNEL)
def _prepare_rows(xs, block, nibbles, xds, xos, xsums, xqs, xscales):
    for i in range(xs.shape[0]):
        prepare_x(xs[i], block, nibbles, xds[i], xos[i], xsums[i], xqs[i], xscales[i])


@numba.njit(inline="always", **_KERNEL)
def _group_span_rows(item, codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums, xqs, xscales,
                     out_t):
    """_group_span for every row i of xs, out_t[m] [rows, oc]: the span's weight rows stay in cache."""
    m = spans[item, 0]
    _span_rows(codes_t[m], alpha_t[m], k_t[m], bias_t[m], spans[item, 1], spans[item, 2], xs, nibbles, block, xds,
               xos, xsums, xqs, xscales, out_t[m])


@numba.njit(parallel=True, **_KERNEL)
def gemv_rows_group(codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums, xqs, xscales, out_t):
    """gemv_group for a few rows of x (xs [rows, ic], per-row buffers, out_t[m] [rows, oc]): each
    span of weight rows is read from memory once and every row of x passes over it while it is
    in cache, so a verify block costs little more than one decode step."""
    _prepare_rows(xs, block, nibbles, xds, xos, xsums, xqs, xscales)
    for item in prange(spans.shape[0]):
        _group_span_rows(item, codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums, xqs,
                         xscales, out_t)


@numba.njit(**_SERIAL_GEMV)
def gemv_rows_group_serial(codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums, xqs, xscales,
                           out_t):
    _prepare_rows(xs, block, nibbles, xds, xos, xsums, xqs, xscales)
    for item in range(spans.shape[0]):
        _group_span_rows(item, codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums, xqs,
                         xscales, out_t)


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
def gemv_gated(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, xq, xscale, out_t, out):
    """out = up * silu(gate) with out_t = (gate, up) = matrices 0 and 1 times x (gemv_group): MNN's
    MUL_SILU(up, gate). Each thread streams one run of rows; a thread that went from gate rows to
    up rows and back read 12% slower (measured), and SiLU row by row beside the GEMV a further 10%."""
    prepare_x(x, block, nibbles, xd, xo, xsum, xq, xscale)
    for item in prange(spans.shape[0]):
        _group_span(item, codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, xq, xscale, out_t)
    fastmath.silu_times(out_t[1], out_t[0], out)


@numba.njit(**_SERIAL_GEMV)
def gemv_gated_serial(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, xq, xscale, out_t, out):
    prepare_x(x, block, nibbles, xd, xo, xsum, xq, xscale)
    for item in range(spans.shape[0]):
        _group_span(item, codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, xq, xscale, out_t)
    fastmath.silu_times(out_t[1], out_t[0], out)


@numba.njit(parallel=True, **_KERNEL)
def gemv_rows_gated(codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums, xqs, xscales, out_t,
                    out):
    """gemv_gated for a few rows of x (out_t and out [rows, oc]), each span of weights shared by the
    rows; each row's SiLU is the one-row call's (mul_silu), so it gives the same bits."""
    _prepare_rows(xs, block, nibbles, xds, xos, xsums, xqs, xscales)
    for item in prange(spans.shape[0]):
        _group_span_rows(item, codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums, xqs,
                         xscales, out_t)
    mul_silu(out_t[1], out_t[0], out)


@numba.njit(**_SERIAL_GEMV)
def gemv_rows_gated_serial(codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums, xqs, xscales,
                           out_t, out):
    _prepare_rows(xs, block, nibbles, xds, xos, xsums, xqs, xscales)
    for item in range(spans.shape[0]):
        _group_span_rows(item, codes_t, alpha_t, k_t, bias_t, spans, xs, nibbles, block, xds, xos, xsums, xqs,
                         xscales, out_t)
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


def integer_rounded(x: np.ndarray) -> np.ndarray:
    """x [..., ic] as prepare_x quantizes it: each chunk of QUANT_CHUNK values rounded to steps of
    max|chunk| / QUANT_LEVELS, back in float32."""
    chunks = x.reshape(*x.shape[:-1], -1, QUANT_CHUNK)
    peak = np.abs(chunks).max(axis=-1, keepdims=True)
    step = np.where(peak > 0, peak / QUANT_LEVELS, np.float32(1.0)).astype(np.float32)
    return (np.rint(chunks * (np.float32(1.0) / step)) * step).reshape(x.shape)


def _matrix_times_x(codes, alpha, k, bias, x, nibbles, block, out, integer) -> None:
    """out [..., oc] = x [..., ic] times the matrix, plus bias: one row of x or several. `integer`:
    the codes times x rounded as the integer kernels round it, the (k * scale + min) part times x."""
    oc = out.shape[-1]
    rounded = integer_rounded(x) if integer else x
    for start in range(0, oc, TWIN_ROWS):
        stop = min(oc, start + TWIN_ROWS)
        weights = dequantized(codes, alpha, k, nibbles, block, start, stop)
        if integer:
            offsets = np.repeat(k * alpha[start:stop, :, 1] + alpha[start:stop, :, 0], block, axis=1)
            out[..., start:stop] = rounded @ (weights - offsets).T + x @ offsets.T
        else:
            out[..., start:stop] = x @ weights.T
    if bias.size:
        out += bias


@jit.twin_of(gemv_group)
@jit.twin_of(gemv_group_serial)
@jit.twin_of(gemv_rows_group)
@jit.twin_of(gemv_rows_group_serial)
def gemv_group_numpy(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, xq, xscale, out_t):
    """Every member in full (the spans split the same rows for the threads); x in float32, one row
    [ic] (gemv_group) or a few [rows, ic] (gemv_rows_group)."""
    for m in range(len(codes_t)):
        _matrix_times_x(codes_t[m], alpha_t[m], k_t[m], bias_t[m], x, nibbles, block, out_t[m], xq.size > 0)


@jit.twin_of(gemv_gated)
@jit.twin_of(gemv_gated_serial)
@jit.twin_of(gemv_rows_gated)
@jit.twin_of(gemv_rows_gated_serial)
def gemv_gated_numpy(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, xq, xscale, out_t, out):
    gemv_group_numpy(codes_t, alpha_t, k_t, bias_t, spans, x, nibbles, block, xd, xo, xsum, xq, xscale, out_t)
    fastmath.silu_times_numpy(out_t[1], out_t[0], out)


@jit.twin_of(dequantize_rows)
def dequantize_rows_numpy(codes, alpha, k, nibbles, block, start, out):
    out[:] = dequantized(codes, alpha, k, nibbles, block, start, start + out.shape[0])


jit.twin_of(mul_silu)(fastmath.silu_times_numpy)
