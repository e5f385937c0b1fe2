"""Normalization: MNN's LayerNorm op (an RMSNorm when `useRMSNorm`), over the trailing axes.

Its weights are gamma and beta, inline in the table or in the weight file at
`external` = [offset, gamma_bytes, beta_bytes], stored back to back.
"""

from __future__ import annotations

import numpy as np

from mnngpu.errors import WeightFileError
from mnngpu.format.params import LayerNorm
from mnngpu.format.weights import WeightFile, read_floats
from mnngpu.ops.common import ALWAYS, OpType, same


def read_layernorm(weights: WeightFile | None, ln: LayerNorm,
                   what: str = "LayerNorm") -> tuple[np.ndarray | None, np.ndarray | None]:
    """(gamma, beta) as float32, from `ln.external` in the weight file or from the inline vectors.

    Either is None when the op has none (an RMSNorm export still stores a zero beta).
    """
    if ln.external is None or len(ln.external) < 2:
        return ln.gamma, ln.beta
    if weights is None:
        raise WeightFileError("a weight file: this LayerNorm keeps gamma/beta externally", field=what)
    offset, gamma_bytes = ln.external[0], ln.external[1]
    beta_bytes = ln.external[2] if len(ln.external) > 2 else 0
    gamma = read_floats(weights, offset, gamma_bytes, f"{what}.external[1] (gamma)")
    beta = read_floats(weights, offset + gamma_bytes, beta_bytes, f"{what}.external[2] (beta)")
    if gamma is not None and beta is not None and beta.size != gamma.size:
        raise WeightFileError(f"beta as long as gamma ({gamma.size} floats), got {beta.size}",
                              path=weights.path, field=what)
    return gamma, beta


def layer_norm_weights(weights: WeightFile | None, param: LayerNorm, name: str) -> dict:
    gamma, beta = read_layernorm(weights, param, name)
    return {"gamma": gamma, "beta": beta}


ROWS = {
    "LayerNorm": OpType(same, param="LayerNorm", param_required=ALWAYS, weights=layer_norm_weights),
}
