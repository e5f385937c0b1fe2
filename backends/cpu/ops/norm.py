"""LayerNorm / RMSNorm over the last axes (MNN's LayerNorm with useRMSNorm)."""

from __future__ import annotations

import numpy as np

from mnngpu.backend import Execution


def layer_norm(x: np.ndarray, gamma, beta, eps: float, rms: bool, axes: int) -> np.ndarray:
    shape = x.shape
    rows = x.reshape(-1, int(np.prod(shape[len(shape) - axes:])))
    if rms:
        normed = rows / np.sqrt(np.mean(rows * rows, axis=1, keepdims=True) + eps)
    else:
        centred = rows - rows.mean(axis=1, keepdims=True)
        normed = centred / np.sqrt(np.mean(centred * centred, axis=1, keepdims=True) + eps)
    if gamma is not None:
        normed = normed * gamma.reshape(1, -1)
    if beta is not None:
        normed = normed + beta.reshape(1, -1)
    return normed.astype(np.float32, copy=False).reshape(shape)


class CPULayerNorm(Execution):
    def onExecute(self, inputs, outputs):  # noqa: N802
        p = self.node.param
        axes = len(p.axis) if getattr(p, "axis", None) else 1
        outputs[0].device = layer_norm(inputs[0].device, self.node.weights.get("gamma"),
                                       self.node.weights.get("beta"), p.epsilon, bool(p.useRMSNorm), axes)
