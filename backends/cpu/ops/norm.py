"""LayerNorm / RMSNorm over the last axes (MNN's LayerNorm with useRMSNorm), one row at a time."""

from __future__ import annotations

import numba
import numpy as np

from mnngpu import jit
from mnngpu.backends.cpu.ops.base import CPUExecution
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
        self.folded = False   # set by normed_linear.fold_norms: the next linear's kernel does this step
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


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"LayerNorm": CPULayerNorm}
