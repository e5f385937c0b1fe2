"""Attention: MNN's fused attention op over (query, key, value[, mask]), with the KV cache the
runtime keeps (mnngpu/backend/kv.py); a vision encoder's runs without one."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.ops.common import ALWAYS, FLOAT, OpType, Shape

if TYPE_CHECKING:
    from mnngpu.backend import Node, Tensor


def _attention_shape(node: Node, inputs: list[Tensor]) -> Shape:
    q = inputs[0].shape  # (1, seq, heads, head_dim)
    if len(q) != 4:
        raise ModelFormatError(f"Attention query must be 4-D (1, seq, heads, head_dim), got {q}", field=node.name)
    if getattr(node.param, "output_c4", False):
        return (q[0] * q[1], q[2] * q[3], 1, 1)
    return (q[0], q[1], q[2] * q[3])


def attention(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    return [(_attention_shape(node, inputs), FLOAT)]


ROWS = {
    "Attention": OpType(attention, param="AttentionParam", param_required=ALWAYS, min_inputs=3),
}


def key_window(mask: Tensor) -> int:
    """The window an Attention op's mask input carries; 0 (causal only) where it is not a
    one-value host tensor."""
    if mask.host is None or mask.host.size != 1:
        return 0
    return max(0, int(mask.host.reshape(-1)[0]))
