"""LayerNorm / RMSNorm over the last axes (MNN's LayerNorm with useRMSNorm), one row at a time.

A LayerNorm folded into the int4 linear layer that reads it (fold_norms), where its rows go in one
lane-kernel call (a decode step, a verify block, a short chunk): the residual add, the norm and the
quantization of its output run in the linear's launch, so a decoder layer's two norms cost no step
of their own. The fold is made on the executions of one resize, after their buffers are bound: a
LayerNorm whose next running execution (views run nothing) is a lane-packed CPULinear reading
exactly the norm's output buffer. The folded kernel still writes both of the norm's outputs (the
sum and the normed rows), with norm_rows' own arithmetic, so any other reader of them sees what it
saw before; the LayerNorm's step then does nothing.
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
from mnngpu.backends.cpu.ops.base import CPUExecution
from mnngpu.backends.cpu.ops.linear import CPULinear
from mnngpu.ops import norm


@numba.njit(fastmath=True, cache=True, nogil=True)
def norm_rows(x, gamma, beta, eps, rms, out):
    """x, out [rows, n]; gamma, beta [n] or empty. Sums in float64: a row of 896 is cheap."""
    n = x.shape[1]
    for r in range(x.shape[0]):
        mean = 0.0
        if not rms:
            for i in range(n):
                mean += x[r, i]
            mean /= n
        var = 0.0
        for i in range(n):
            d = x[r, i] - mean
            var += d * d
        inv = np.float32(1.0 / np.sqrt(var / n + eps))
        shift = np.float32(mean)
        for i in range(n):
            value = (x[r, i] - shift) * inv
            if gamma.size:
                value *= gamma[i]
            if beta.size:
                value += beta[i]
            out[r, i] = value


@jit.twin_of(norm_rows)
def norm_rows_numpy(x, gamma, beta, eps, rms, out):
    rows = x.astype(np.float64)
    mean = 0.0 if rms else rows.mean(axis=1, keepdims=True)
    var = ((rows - mean) ** 2).mean(axis=1, keepdims=True)
    value = (rows - mean) / np.sqrt(var + eps)
    if gamma.size:
        value *= gamma
    if beta.size:
        value += beta
    out[:] = value


def layer_norm(x: np.ndarray, gamma, beta, eps: float, rms: bool, axes: int) -> np.ndarray:
    """The reference path for tests and odd inputs: x normalized over its last `axes` axes."""
    shape = x.shape
    n = int(np.prod(shape[len(shape) - axes:]))
    out = np.empty((x.size // n, n), dtype=np.float32)
    empty = np.zeros(0, dtype=np.float32)
    args = (np.ascontiguousarray(x, dtype=np.float32).reshape(-1, n),
            empty if gamma is None else np.ascontiguousarray(gamma, dtype=np.float32).reshape(-1),
            empty if beta is None else np.ascontiguousarray(beta, dtype=np.float32).reshape(-1),
            float(eps), bool(rms), out)
    jit.runnable(norm_rows, args)(*args)
    return out.reshape(shape)


class CPULayerNorm(CPUExecution):
    """With a residual input (mnngpu/ops/norm.py), x + residual first: into the first of two outputs,
    else into a work array."""

    def plan(self, inputs, outputs):
        p = self.node.param
        self.n = norm.norm_width(p, outputs[-1].shape)
        empty = np.zeros(0, dtype=np.float32)
        gamma, beta = self.node.weights.get("gamma"), self.node.weights.get("beta")
        if bool(p.useRMSNorm) and beta is not None and not beta.any():
            beta = None   # an RMSNorm export stores a zero beta
        self.gamma = empty if gamma is None else np.ascontiguousarray(gamma, dtype=np.float32).reshape(-1)
        self.beta = empty if beta is None else np.ascontiguousarray(beta, dtype=np.float32).reshape(-1)
        self.eps, self.rms = float(p.epsilon), bool(p.useRMSNorm)

    def bind(self):
        self.folded = False   # set by fold_norms: the next linear's kernel does this step
        x = self.value(self.inputs[0])
        self.addends = None
        if len(self.inputs) > 1:   # addends of two shapes broadcast, as MNN's BinaryOp does
            self.addends = (x, self.value(self.inputs[1]))
            x = (self.outputs[0].device if len(self.outputs) > 1
                 else self.backend._scratch("residual_sum", self.outputs[0].shape))
        x = x.reshape(-1, self.n)
        self.out = self.outputs[-1].device.reshape(-1, self.n)
        self.args = (x, self.gamma, self.beta, self.eps, self.rms, self.out)
        self.norm_rows = jit.runnable(norm_rows, self.args)

    def onExecute(self, inputs, outputs):  # noqa: N802
        if self.folded:
            return
        if self.addends is not None:
            np.add(*self.addends, out=self.args[0].reshape(self.outputs[0].shape))
        self.norm_rows(*self.args)


# ---- the norm folded into the linear layer after it -------------------------------------------

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
    for layer_norm, linear in zip(running, running[1:]):
        args = _norm_args(layer_norm, linear)
        if args is not None:
            linear.fold_norm(args, FOLDED[linear.kernel_name])
            layer_norm.folded = True
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


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"LayerNorm": CPULayerNorm}
