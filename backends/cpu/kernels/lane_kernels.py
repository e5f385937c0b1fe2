"""numba kernels of the int4 linear layer at precision low, on weights repacked into lane groups.

The matrix is cut into groups of LANES (16) output rows, padded with zero rows to a whole group.
Each group keeps, per chunk of 64 inputs, 512 code bytes: 16 steps of 32 bytes, where bytes 2l
and 2l+1 of step s hold lane l's codes of inputs 4s, 4s+1 (low nibbles) and 4s+2, 4s+3 (high
nibbles). Zero-extended to int16, the low and the high nibbles of one step are each a register
of 16 lanes x 2 codes, which one int16 dot-product instruction multiplies by a pair of inputs
broadcast to every lane. The float work (converting a chunk's integer sums and scaling them) is
then done once per 16 output rows instead of once per row, so a verify block of a few rows and
a prefill run on the dot instructions, and a decode step reads memory as fast as before.
    codes uint8 [groups, chunks, 512],   alpha float16 bits [groups, blocks, 32] (16 mins, 16 scales)
    w[o, i] = (code + k) * scale + min   (the weight file's own asymmetric alpha, rounded to float16)

The alpha is kept in float16, as llama.cpp's Q4_0 keeps its scales: a block of 64 weights then
takes 36 bytes instead of 40, and a decode step, which streams every weight, reads 10% less.
Rounding moves each min and scale by at most 2^-11 of itself, under 1% of the int4 rounding
of the weights themselves; precision low is where mnngpu computes in half precision anyway.

x is quantized to int16 per chunk of 64 (step max|x|/32767, far finer than the int4 weights):
    y[o] = sum_c scale_b[o] * xscale_c * dot_c[o]  +  sum_b (k * scale_b[o] + min_b[o]) * sum(x in b)
With `int8_activations` (mnngpu's own config key) x is int8 instead (step max|x|/127), as MNN's
memory-low CPU path quantizes it: one unsigned-by-signed byte dot takes four inputs where the int16
path needs two dots, so the rows of a prefill or a batched decode step cost about half the dot
instructions. It is not the default: on the 0.5B-shaped bench model it moves the logits up to half
their std from the exact ones (int16: 0.3%), and greedy tokens part from MNN's sooner; MNN's own
memory-low path moves them 7-29% (docs/runtime_options.md). The kernels take the type of their xq
work array.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from mnngpu import jit
from mnngpu.backends.cpu.kernels import fastmath
from mnngpu.backends.cpu.kernels.intrinsics import (
    GROUP_ROWS,
    LANES,
    QUANT_CHUNK,
    group1_u4,
    group2_u4,
    group3_u4,
    group4_u4,
    rint,
)
from mnngpu.backends.cpu.kernels.linear_kernels import mul_silu

PACK_GROUPS = 256   # groups repacked at a time: a bounded temporary, whatever the matrix

_KERNEL = {"fastmath": True, "cache": True, "nogil": True}
_SERIAL = {"parallel": True, **_KERNEL}   # parallel=True makes numba's loop code faster (linear_kernels.py)


HALF_MAX = 65504.0


def packable(oc: int, ic: int, block: int, alpha: np.ndarray) -> bool:
    """Whether lane groups can hold the layer: whole chunks per block, and every min and scale
    within float16's range."""
    return block % QUANT_CHUNK == 0 and ic % block == 0 and oc > 0 and float(np.abs(alpha).max()) <= HALF_MAX


def pack(codes: np.ndarray, alpha: np.ndarray, release=None) -> tuple[np.ndarray, np.ndarray]:
    """(codes [groups, chunks, 512], alpha float16 as uint16 [groups, blocks, 32]) from the file's
    layout: codes uint8 [oc, ic/2] (input 2j in the high nibble of byte j) and alpha [oc, blocks, 2]
    (min, scale). `release(view)` is called on each part of the inputs once it is repacked."""
    oc, half = codes.shape
    groups, chunks, blocks = -(-oc // LANES), 2 * half // QUANT_CHUNK, alpha.shape[1]
    lanes = np.empty((groups, chunks, 16, LANES, 2), dtype=np.uint8)
    lane_alpha = np.empty((groups, blocks, 2, LANES), dtype=np.float32)
    for first in range(0, groups, PACK_GROUPS):
        last = min(groups, first + PACK_GROUPS)
        args = (codes, alpha, first, last, lanes, lane_alpha)
        jit.runnable(pack_groups, args)(*args)
        if release is not None:
            release(codes[first * LANES:last * LANES])
            release(alpha[first * LANES:last * LANES])
    # numba's CPU target stores no float16, so the kernel packs float32 and numpy rounds it
    return lanes.reshape(groups, chunks, -1), half_bits(lane_alpha).reshape(groups, blocks, -1)


def half_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> float16, kept as its uint16 bits (the kernels' alpha)."""
    return values.astype(np.float16).view(np.uint16)


@numba.njit(parallel=True, **_KERNEL)
def pack_groups(codes, alpha, first, last, lanes, lane_alpha):
    """Lane groups first..last-1 of pack's output (lanes [groups, chunks, 16, 16, 2], lane_alpha
    [groups, blocks, 2, 16]); rows past the matrix's end are zeros."""
    oc = codes.shape[0]
    for g in prange(first, last):
        for lane in range(LANES):
            o = g * LANES + lane
            for c in range(lanes.shape[1]):
                for s in range(16):
                    a = codes[o, 32 * c + 2 * s] if o < oc else np.uint8(0)
                    b = codes[o, 32 * c + 2 * s + 1] if o < oc else np.uint8(0)
                    lanes[g, c, s, lane, 0] = (a >> 4) | (b & 0xF0)
                    lanes[g, c, s, lane, 1] = (a & 15) | ((b & 15) << 4)
            for b in range(lane_alpha.shape[1]):
                lane_alpha[g, b, 0, lane] = alpha[o, b, 0] if o < oc else np.float32(0.0)
                lane_alpha[g, b, 1, lane] = alpha[o, b, 1] if o < oc else np.float32(0.0)


@jit.twin_of(pack_groups)
def pack_groups_numpy(codes, alpha, first, last, lanes, lane_alpha):
    chunks, blocks = lanes.shape[1], lane_alpha.shape[1]
    rows = _padded(codes, first * LANES, last * LANES).reshape(last - first, LANES, chunks, 16, 2)
    a, b = rows[..., 0], rows[..., 1]   # inputs (4s, 4s+1) and (4s+2, 4s+3): high nibble first
    pairs = np.stack([(a >> 4) | (b & 0xF0), (a & 15) | (b << 4)], axis=-1)   # [g, lane, chunk, step, 2]
    lanes[first:last] = pairs.transpose(0, 2, 3, 1, 4)
    pairs = _padded(alpha, first * LANES, last * LANES).reshape(last - first, LANES, blocks, 2)
    lane_alpha[first:last] = pairs.transpose(0, 2, 3, 1)


def _padded(array: np.ndarray, start: int, stop: int) -> np.ndarray:
    """array[start:stop] with zero rows past its end."""
    part = array[start:stop]
    if part.shape[0] == stop - start:
        return part
    return np.concatenate([part, np.zeros((stop - start - part.shape[0], *array.shape[1:]), array.dtype)])


def unpacked(codes: np.ndarray, alpha: np.ndarray, k, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes * scale, k * scale + min) of rows [start, stop), each float32 [rows, ic]: pack's
    inverse, the weights split as the kernels split them."""
    first, last = start // LANES, -(-stop // LANES)
    groups, chunks = last - first, codes.shape[1]
    steps = codes[first:last].reshape(groups, chunks, 16, LANES, 2)
    levels = np.empty((groups, LANES, chunks, 16, 4), dtype=np.float32)
    levels[..., :2] = (steps & 15).transpose(0, 3, 1, 2, 4)
    levels[..., 2:] = (steps >> 4).transpose(0, 3, 1, 2, 4)
    pairs = alpha[first:last].view(np.float16).astype(np.float32)
    pairs = pairs.reshape(groups, -1, 2, LANES).transpose(0, 3, 1, 2)   # [g, lane, block, (min, scale)]
    ic = chunks * QUANT_CHUNK
    block = ic // pairs.shape[2]
    scale = np.repeat(pairs[..., 1], block, axis=-1).reshape(-1, ic)
    low = np.repeat(k * pairs[..., 1] + pairs[..., 0], block, axis=-1).reshape(-1, ic)
    rows = slice(start - first * LANES, stop - first * LANES)
    return levels.reshape(-1, ic)[rows] * scale[rows], low[rows]


X_BUFFERS = ("xq", "xscale", "xsum")


def x_layouts(rows: int, ic: int, block: int, xq_type=np.int16) -> tuple:
    """(shape, dtype) of each of X_BUFFERS, the kernels' work arrays for `rows` rows of x: xq
    [rows, ic] (int16, or int8 with int8_activations), xscale [rows, chunks], xsum [rows, blocks]."""
    return ((rows, ic), xq_type), ((rows, ic // QUANT_CHUNK), np.float32), ((rows, ic // block), np.float32)


def x_buffers(rows: int, ic: int, block: int, xq_type=np.int16) -> tuple:
    return tuple(np.empty(shape, dtype) for shape, dtype in x_layouts(rows, ic, block, xq_type))


def quant_levels(xq_type) -> np.float32:
    """The largest code of x quantized into an array of this integer type: x's step is max|x| / it."""
    return np.float32(np.iinfo(xq_type).max)


ABS_BITS = np.uint32(0x7FFFFFFF)   # a float32's bits without its sign


@numba.njit(inline="always", **_KERNEL)
def _prepare_row(x, block, xq, xscale, xsum):
    """x's block sums, and each chunk quantized to int16 with its step. The loops index with
    unsigned integers, which lets LLVM vectorize them (signed indices carry numba's wraparound
    check); the chunk's peak |x| is an integer max over the values' bits without their sign
    (finite floats of one sign order as their bits), since a float max does not vectorize. A
    4864-wide row: 5.3 -> 1.3 us."""
    chunk, width = np.uint64(QUANT_CHUNK), np.uint64(block)
    for b in range(np.uint64(xsum.size)):
        total = np.float32(0.0)
        for j in range(b * width, b * width + width):
            total += x[j]
        xsum[b] = total
    bits, peaks = x.view(np.uint32), xscale.view(np.uint32)
    for c in range(np.uint64(xscale.size)):
        peak = np.uint32(0)
        for j in range(c * chunk, c * chunk + chunk):
            peak = max(peak, bits[j] & ABS_BITS)
        peaks[c] = peak
    levels = np.float32(np.iinfo(xq.dtype).max)
    for c in range(np.uint64(xscale.size)):
        peak = xscale[c]
        step = peak / levels if peak > 0 else np.float32(1.0)
        xscale[c] = step
        inverse = np.float32(1.0) / step
        for j in range(c * chunk, c * chunk + chunk):
            xq[j] = np.int32(rint(x[j] * inverse))


PREPARE_SPLIT_ROWS = 8   # rows of x from which their quantization is split over the threads


@numba.njit(inline="always", **_KERNEL)
def _prepare_rows(xs, block, xq, xscale, xsum):
    """_prepare_row of every row of xs. A few rows (a decode step, a verify block) are done on the
    calling thread: a parallel loop of its own would cost a second launch per call (~1.2 us)."""
    if xs.shape[0] < PREPARE_SPLIT_ROWS:
        for i in range(xs.shape[0]):
            _prepare_row(xs[i], block, xq[i], xscale[i], xsum[i])
    else:
        for i in prange(xs.shape[0]):
            _prepare_row(xs[i], block, xq[i], xscale[i], xsum[i])


@numba.njit(inline="always", **_KERNEL)
def _span(item, codes_t, alpha_t, k_t, bias_t, spans, block, xq, xscale, xsum, out_t):
    """Output rows spans[item, 1] <= r < spans[item, 2] (whole groups but the last) of member
    spans[item, 0] times every row of x: GROUP_ROWS rows at a time share each group's codes, and
    so do the one to three left over."""
    m = spans[item, 0]
    codes, alpha, k, bias, out = codes_t[m], alpha_t[m], k_t[m], bias_t[m], out_t[m]
    start, stop = spans[item, 1], spans[item, 2]
    rows = xq.shape[0]
    grouped = rows - rows % GROUP_ROWS
    chunks_per_block = block // QUANT_CHUNK
    for g in range(start // LANES, (stop + LANES - 1) // LANES):
        valid = min(LANES, out.shape[1] - g * LANES)
        for i in range(0, grouped, GROUP_ROWS):
            group4_u4(codes, alpha, g, k, chunks_per_block, xq, xscale, xsum, i, out, g * LANES, valid)
        left = rows - grouped
        if left == 3:
            group3_u4(codes, alpha, g, k, chunks_per_block, xq, xscale, xsum, grouped, out, g * LANES, valid)
        elif left == 2:
            group2_u4(codes, alpha, g, k, chunks_per_block, xq, xscale, xsum, grouped, out, g * LANES, valid)
        elif left == 1:
            group1_u4(codes, alpha, g, k, chunks_per_block, xq, xscale, xsum, grouped, out, g * LANES, valid)
    if bias.size:
        for i in range(rows):
            for r in range(start, stop):
                out[i, r] += bias[r]


@numba.njit(parallel=True, **_KERNEL)
def lanes_group(codes_t, alpha_t, k_t, bias_t, spans, xs, block, xq, xscale, xsum, out_t):
    """Several lane-packed matrices with the same input rows xs [rows, ic] in one launch:
    out_t[m] [rows, oc] = xs . W_m^T + bias_m, the work split into spans of rows (member, first,
    end; row_spans) over the threads."""
    _prepare_rows(xs, block, xq, xscale, xsum)
    for item in prange(spans.shape[0]):
        _span(item, codes_t, alpha_t, k_t, bias_t, spans, block, xq, xscale, xsum, out_t)


@numba.njit(**_SERIAL)
def lanes_group_serial(codes_t, alpha_t, k_t, bias_t, spans, xs, block, xq, xscale, xsum, out_t):
    """lanes_group on the calling thread: for matrices too small to repay a parallel launch."""
    for i in range(xs.shape[0]):
        _prepare_row(xs[i], block, xq[i], xscale[i], xsum[i])
    for item in range(spans.shape[0]):
        _span(item, codes_t, alpha_t, k_t, bias_t, spans, block, xq, xscale, xsum, out_t)


@numba.njit(parallel=True, **_KERNEL)
def lanes_gated(codes_t, alpha_t, k_t, bias_t, spans, xs, block, xq, xscale, xsum, out_t, out):
    """out = up * silu(gate) with out_t = (gate, up) = members 0 and 1 times xs (lanes_group):
    MNN's MUL_SILU(up, gate), each row's SiLU the one-row call's."""
    _prepare_rows(xs, block, xq, xscale, xsum)
    for item in prange(spans.shape[0]):
        _span(item, codes_t, alpha_t, k_t, bias_t, spans, block, xq, xscale, xsum, out_t)
    mul_silu(out_t[1], out_t[0], out)


@numba.njit(**_SERIAL)
def lanes_gated_serial(codes_t, alpha_t, k_t, bias_t, spans, xs, block, xq, xscale, xsum, out_t, out):
    for i in range(xs.shape[0]):
        _prepare_row(xs[i], block, xq[i], xscale[i], xsum[i])
    for item in range(spans.shape[0]):
        _span(item, codes_t, alpha_t, k_t, bias_t, spans, block, xq, xscale, xsum, out_t)
    mul_silu(out_t[1], out_t[0], out)


# ---- numpy twins: the stand-ins while the kernels above compile (mnngpu/jit.py) -----------------

TWIN_ROWS = 2048   # rows unpacked at a time: a bounded float32 copy, whatever the matrix


def integer_rounded(x: np.ndarray, xq_type=np.int16) -> np.ndarray:
    """x [..., ic] as the kernels quantize it into xq_type: each chunk of QUANT_CHUNK values rounded
    to steps of max|chunk| / quant_levels(xq_type), back in float32."""
    chunks = x.reshape(*x.shape[:-1], -1, QUANT_CHUNK)
    peak = np.abs(chunks).max(axis=-1, keepdims=True)
    step = np.where(peak > 0, peak / quant_levels(xq_type), np.float32(1.0)).astype(np.float32)
    return (np.rint(chunks * (np.float32(1.0) / step)) * step).reshape(x.shape)


@jit.twin_of(lanes_group)
@jit.twin_of(lanes_group_serial)
def lanes_group_numpy(codes_t, alpha_t, k_t, bias_t, spans, xs, block, xq, xscale, xsum, out_t):
    """Every member in full: the codes times x rounded as the kernels round it, the
    (k * scale + min) part times x."""
    rounded = integer_rounded(xs, xq.dtype)
    for codes, alpha, k, bias, out in zip(codes_t, alpha_t, k_t, bias_t, out_t):
        for start in range(0, out.shape[1], TWIN_ROWS):
            stop = min(out.shape[1], start + TWIN_ROWS)
            levels, low = unpacked(codes, alpha, k, start, stop)
            out[:, start:stop] = rounded @ levels.T + xs @ low.T
        if bias.size:
            out += bias


@jit.twin_of(lanes_gated)
@jit.twin_of(lanes_gated_serial)
def lanes_gated_numpy(codes_t, alpha_t, k_t, bias_t, spans, xs, block, xq, xscale, xsum, out_t, out):
    lanes_group_numpy(codes_t, alpha_t, k_t, bias_t, spans, xs, block, xq, xscale, xsum, out_t)
    fastmath.silu_times_numpy(out_t[1], out_t[0], out)
