"""A LayerNorm folded into the int4 linear layer that reads it, where its rows go in one lane-kernel call
(a decode step, a verify block, a short chunk): the residual add, the norm and the quantization of its
output run in the linear's launch, so a decoder layer's two norms cost no step of their own.

The fold is made on the executions of one resize, after their buffers are bound
(`fold_norms`): a LayerNorm whose next running execution (views run nothing) is a lane-packed
CPULinear reading exactly the norm's output buffer. The folded kernel still writes both of the norm's outputs (the sum and the
normed rows), with the norm's own arithmetic (`norm.norm_rows`), so any other reader of them sees
what it saw before; the LayerNorm's step then does nothing.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from mnngpu import jit
from mnngpu.backends.cpu.kernels import fastmath
from mnngpu.backends.cpu.kernels.lane_kernels import (
    _KERNEL,
    _SERIAL,
    _prepare_row,
    _prepare_rows,
    _span,
    lanes_group_numpy,
)
from mnngpu.backends.cpu.kernels.linear_kernels import mul_silu
from mnngpu.backends.cpu.ops.linear import CPULinear
from mnngpu.backends.cpu.ops.norm import CPULayerNorm, norm_rows, norm_rows_numpy


@numba.njit(inline="always", **_KERNEL)
def _residual_norm(a, b, sums, gamma, beta, eps, rms, xs):
    """CPULayerNorm's step: sums = a + b when b has rows (else the norm reads a), xs = its norm."""
    if b.shape[0]:
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                sums[i, j] = a[i, j] + b[i, j]
        norm_rows(sums, gamma, beta, eps, rms, xs)
    else:
        norm_rows(a, gamma, beta, eps, rms, xs)


@numba.njit(parallel=True, **_KERNEL)
def normed_lanes_group(a, b, sums, gamma, beta, eps, rms,
                       codes_t, alpha_t, k_t, bias_t, spans, xs, block, xq, xscale, xsum, out_t):
    """lane_kernels.lanes_group on xs = the norm of a (+ b), computed first in the same launch."""
    _residual_norm(a, b, sums, gamma, beta, eps, rms, xs)
    _prepare_rows(xs, block, xq, xscale, xsum)
    for item in prange(spans.shape[0]):
        _span(item, codes_t, alpha_t, k_t, bias_t, spans, block, xq, xscale, xsum, out_t)


@numba.njit(**_SERIAL)
def normed_lanes_group_serial(a, b, sums, gamma, beta, eps, rms,
                              codes_t, alpha_t, k_t, bias_t, spans, xs, block, xq, xscale, xsum, out_t):
    _residual_norm(a, b, sums, gamma, beta, eps, rms, xs)
    for i in range(xs.shape[0]):
        _prepare_row(xs[i], block, xq[i], xscale[i], xsum[i])
    for item in range(spans.shape[0]):
        _span(item, codes_t, alpha_t, k_t, bias_t, spans, block, xq, xscale, xsum, out_t)


@numba.njit(parallel=True, **_KERNEL)
def normed_lanes_gated(a, b, sums, gamma, beta, eps, rms,
                       codes_t, alpha_t, k_t, bias_t, spans, xs, block, xq, xscale, xsum, out_t, out):
    """lane_kernels.lanes_gated on xs = the norm of a (+ b)."""
    _residual_norm(a, b, sums, gamma, beta, eps, rms, xs)
    _prepare_rows(xs, block, xq, xscale, xsum)
    for item in prange(spans.shape[0]):
        _span(item, codes_t, alpha_t, k_t, bias_t, spans, block, xq, xscale, xsum, out_t)
    mul_silu(out_t[1], out_t[0], out)


@numba.njit(**_SERIAL)
def normed_lanes_gated_serial(a, b, sums, gamma, beta, eps, rms,
                              codes_t, alpha_t, k_t, bias_t, spans, xs, block, xq, xscale, xsum, out_t, out):
    _residual_norm(a, b, sums, gamma, beta, eps, rms, xs)
    for i in range(xs.shape[0]):
        _prepare_row(xs[i], block, xq[i], xscale[i], xsum[i])
    for item in range(spans.shape[0]):
        _span(item, codes_t, alpha_t, k_t, bias_t, spans, block, xq, xscale, xsum, out_t)
    mul_silu(out_t[1], out_t[0], out)


# ---- numpy twins: the stand-ins while the kernels above compile (mnngpu/jit.py) -----------------

def _residual_norm_numpy(a, b, sums, gamma, beta, eps, rms, xs):
    if b.shape[0]:
        np.add(a, b, out=sums)
        a = sums
    norm_rows_numpy(a, gamma, beta, eps, rms, xs)


@jit.twin_of(normed_lanes_group)
@jit.twin_of(normed_lanes_group_serial)
def normed_lanes_group_numpy(a, b, sums, gamma, beta, eps, rms, *linear):
    _residual_norm_numpy(a, b, sums, gamma, beta, eps, rms, linear[5])   # xs
    lanes_group_numpy(*linear)


@jit.twin_of(normed_lanes_gated)
@jit.twin_of(normed_lanes_gated_serial)
def normed_lanes_gated_numpy(a, b, sums, gamma, beta, eps, rms, *linear):
    _residual_norm_numpy(a, b, sums, gamma, beta, eps, rms, linear[5])   # xs
    *group, out = linear
    out_t = group[-1]
    lanes_group_numpy(*group)
    fastmath.silu_times_numpy(out_t[1], out_t[0], out)


FOLDED = {   # a lane kernel -> the same kernel after the norm
    "lanes_group": normed_lanes_group, "lanes_group_serial": normed_lanes_group_serial,
    "lanes_gated": normed_lanes_gated, "lanes_gated_serial": normed_lanes_gated_serial,
}


# ---- the fold -----------------------------------------------------------------------------------

def fold_norms(executions: list) -> int:
    """Fold each LayerNorm into the lane-packed linear execution right after it that reads its
    output buffer and runs in one kernel call; how many were folded."""
    folded = 0
    running = [execution for execution in executions if execution.needs_run]   # views run nothing
    for norm, linear in zip(running, running[1:]):
        args = _norm_args(norm, linear)
        if args is not None:
            linear.fold_norm(args, FOLDED[linear.kernel_name])
            norm.folded = True
            folded += 1
    return folded


def _norm_args(norm, linear) -> tuple | None:
    """The folded kernel's norm arguments (a, b, sums, gamma, beta, eps, rms), or None where the
    pair cannot fold."""
    if type(norm) is not CPULayerNorm or not isinstance(linear, CPULinear) or norm.folded:
        return None
    if len(linear.gemv_calls) != 1 or not linear.weights[0].lanes or linear.kernel_name not in FOLDED:
        return None
    x, _, _, _, _, out = norm.args
    xs = linear.gemv_calls[0][5]
    if xs.shape != out.shape or xs.ctypes.data != out.ctypes.data:
        return None
    rows = out.shape
    if norm.addends is None:
        a, b, sums = x, np.empty((0, rows[1]), np.float32), x
    else:
        if any(addend.size != out.size or addend.dtype != np.float32 for addend in norm.addends):
            return None   # a broadcast add stays the norm's own
        a, b = (np.ascontiguousarray(addend).reshape(rows) for addend in norm.addends)
        if any(not np.shares_memory(view, addend) for view, addend in zip((a, b), norm.addends)):
            return None
        sums = x
    return (a, b, sums, norm.gamma, norm.beta, norm.eps, norm.rms)
