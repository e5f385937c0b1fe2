"""exp() that vectorizes: without Intel's SVML, numba calls the scalar libm expf once per element,
which made softmax and SiLU a fifth of a 512-token prefill.

    exp(x) = exp(x / 256) ** 256,  exp(x / 256) by its Taylor series to the 7th power,
with x clamped to [-80, 89] (exp(-80) is 2e-35; above 88.7 float32 overflows to inf, as expf
does). Only multiplies and adds: LLVM turns a loop of them into vector code (5x numba's expf,
2x numpy's). float32 rounding, doubled by each squaring, leaves a relative error below 5e-5
(tests/backend/test_cpu_ops.py checks it against numpy).
"""

from __future__ import annotations

import numba
import numpy as np

from mnngpu import jit

_LOW, _HIGH = np.float32(-80.0), np.float32(89.0)
_SHRINK = np.float32(1.0 / 256.0)
_C = tuple(np.float32(1.0 / f) for f in (1, 1, 2, 6, 24, 120, 720, 5040))


@numba.njit(inline="always", fastmath=True, cache=True)
def exp(x):
    t = min(max(x, _LOW), _HIGH) * _SHRINK
    y = _C[7]
    y = y * t + _C[6]
    y = y * t + _C[5]
    y = y * t + _C[4]
    y = y * t + _C[3]
    y = y * t + _C[2]
    y = y * t + _C[1]
    y = y * t + _C[0]
    for _ in range(8):   # (e^t)^256
        y = y * y
    return y


# numba's default error model checks every float division for zero, to raise ZeroDivisionError;
# that branch keeps LLVM from vectorizing a loop with a division. numpy's model divides as IEEE does.
VECTOR_DIVISION = {"error_model": "numpy"}
# A vectorized division is a reciprocal estimate refined by a Newton step, which makes NaN of an
# infinite divisor; silu's exp(-gate) stops at e^80 (5.5e34), where gate / (1 + e^80) is 0 to
# float32's precision of any gate a model holds.
_SILU_EXP_MAX = np.float32(80.0)


@numba.njit(fastmath=True, cache=True, nogil=True, **VECTOR_DIVISION)
def silu_times(up, gate, out):
    """out = up * gate / (1 + exp(-gate)) over 1-D arrays, in two passes: in one loop LLVM
    vectorizes neither the exp nor the division (measured 2.5x slower). 4864 values: 5.9 us with
    the division checked for zero (VECTOR_DIVISION), 2.3 us without."""
    for i in range(out.size):
        out[i] = exp(min(-gate[i], _SILU_EXP_MAX))
    for i in range(out.size):
        out[i] = up[i] * gate[i] / (np.float32(1.0) + out[i])


@jit.twin_of(silu_times)
def silu_times_numpy(up, gate, out):
    """silu_times in numpy, for arrays of any (equal) shape: its stand-in while it compiles."""
    with np.errstate(over="ignore"):
        out[...] = up * gate / (np.float32(1.0) + np.exp(-gate))


_GELU_SCALE, _GELU_CUBE = np.float32(-2.0 * 0.7978845608028654), np.float32(0.044715)


@numba.njit(fastmath=True, cache=True, nogil=True, **VECTOR_DIVISION)
def gelu_tanh(x, out):
    """out = 0.5 x (1 + tanh(0.79788456 (x + 0.044715 x^3))) over 1-D arrays that do not overlap,
    written as x / (1 + exp(-2u)) (the same value: 1 + tanh(u) = 2 / (1 + e^(-2u))), in two passes
    as silu_times is, so that LLVM vectorizes both."""
    for i in range(out.size):
        v = x[i]
        out[i] = exp(min(_GELU_SCALE * (v + _GELU_CUBE * v * v * v), _SILU_EXP_MAX))
    for i in range(out.size):
        out[i] = x[i] / (np.float32(1.0) + out[i])


@jit.twin_of(gelu_tanh)
def gelu_tanh_numpy(x, out):
    """gelu_tanh in numpy: its stand-in while it compiles."""
    out[...] = 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))
