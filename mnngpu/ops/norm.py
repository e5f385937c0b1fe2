"""Normalization: MNN's LayerNorm op (an RMSNorm when `useRMSNorm`), over the trailing axes.

Its weights are gamma and beta, inline in the table or in the weight file at
`external` = [offset, gamma_bytes, beta_bytes], stored back to back.

MNN's converter also fuses a residual add into it (an LFM2 export's feed-forward norms): inputs
(x, residual); with two outputs, x + residual and then its norm; with one, the norm of x + residual.
"""

from __future__ import annotations

import numpy as np

from mnngpu.errors import ModelFormatError, WeightFileError
from mnngpu.format.params import LayerNorm
from mnngpu.format.weights import WeightFile, read_floats
from mnngpu.ops.common import ALWAYS, OpType, Shape, rewritten_at_load


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


def norm_width(param, shape: Shape) -> int:
    """How many trailing values one norm covers: its axes' extent; for a row per token laid out
    (rows, channels, 1, 1) (MNN's fused transformer region, which normalizes over channels), the channels."""
    if len(shape) == 4 and tuple(shape[2:]) == (1, 1):
        return int(shape[1])
    axes = len(param.axis) if getattr(param, "axis", None) else 1
    return int(np.prod(shape[len(shape) - axes:], dtype=np.int64))


def layer_norm(node, inputs) -> list[tuple[Shape, np.dtype]]:
    """x's shape for each output: the norm, or with a residual input the sum (numpy broadcasting) and
    then the norm (an op with one output keeps the first pair, of the same shape)."""
    if len(inputs) > 1:
        try:
            shape = tuple(np.broadcast_shapes(inputs[0].shape, inputs[1].shape))
        except ValueError as exc:
            raise ModelFormatError(f"a residual add of broadcastable shapes, got {inputs[0].shape} and "
                                   f"{inputs[1].shape}", field=node.name) from exc
        return [(shape, inputs[0].dtype)] * 2
    return [(inputs[0].shape, inputs[0].dtype)]


def device_weights(node, upload) -> tuple:
    """(gamma, beta) as a device backend keeps them: each float32 array through `upload`, None where
    the norm has none. The raw arrays stay on the node for the CPU backup."""
    return tuple(None if node.weights.get(name) is None else upload(np.asarray(node.weights[name], dtype=np.float32))
                 for name in ("gamma", "beta"))


def decline(inputs, outputs, node) -> str | None:
    """The form the device kernels do not take (it runs on the CPU backup): a residual add whose
    sum is not an output of the op, or that broadcasts (the kernels add the addends value by value,
    whatever view of the same values each shape is)."""
    if len(inputs) > 1 and (len(outputs) < 2 or not inputs[0].size == inputs[1].size == outputs[0].size):
        return ("a LayerNorm fused with its residual add has a device kernel only where the sum is its first "
                "output and the addends hold as many values as the sum")
    return None


ROWS = {
    "LayerNorm": OpType(layer_norm, param="LayerNorm", param_required=ALWAYS, weights=layer_norm_weights),
    "GatedRMSNorm": OpType(rewritten_at_load, param="LayerNorm", param_required=ALWAYS, min_inputs=2,
                           runs_as="LayerNorm"),
}
