"""Rotary position embedding: the engine's fused rotate-half node, and MNN's RoPE op (306).

The engine's node (ROPE) is made two ways: runtime/fusion.py matches an old export's rotate-half
pattern and checks its split at resize; runtime/c4_ops.py rewrites MNN's RoPE op (a C4 export:
q and k as [seq, heads*head_dim, 1, 1], each head RMS-normed by q_norm/k_norm, then rotated) into a
Reshape, a LayerNorm and a ROPE node of known split per tensor."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.ops.common import ALWAYS, FUSED_PREFIX, OpType, rewritten_at_load, same
from mnngpu.ops.movement import strided_slice

if TYPE_CHECKING:
    from mnngpu.backend import Node, Tensor

ROPE = FUSED_PREFIX + "RoPE"


ROWS = {
    ROPE: OpType(same, fuses="x*cos + concat(-x[..., s:], x[..., :s])*sin (rotate-half)"),
    "RoPE": OpType(rewritten_at_load, param="RoPEParam", param_required=ALWAYS, min_inputs=4, runs_as=ROPE),
}


@dataclass
class RoPEParam:
    """The rotate-half pattern. `ops` are the original ops (global tensor ids); `inputs` maps a
    fused-node input position to its global tensor id, `output` is the pattern's result id."""

    slice_hi: Node | None = None   # x[..., s:]  (negated)
    slice_lo: Node | None = None   # x[..., :s]
    n_hi: int = 0                  # bound inputs of slice_hi (after x); slice_lo's follow them
    concat_axis: int = -1
    split: int | None = None       # known at load (MNN's RoPE op): no slices to check
    rotary_dim: int | None = None  # only x[..., :rotary_dim] rotates (split within it), the rest is copied
    ops: list = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    output: int = -1


def rotary_width(node: Node, x: Tensor) -> int:
    """How many leading dims of x's last axis rotate (cos and sin hold rows of this many)."""
    rotary_dim = getattr(node.param, "rotary_dim", None)
    return rotary_dim if rotary_dim is not None else x.shape[-1]


def rope_split(node: Node, inputs: list[Tensor]) -> int | None:
    """The split point s of a fused RoPE node at resize, or None when its slices and concat are not
    x[..., s:] and x[..., :s] along the last axis (then evaluate `param.ops` as exported)."""
    p: RoPEParam = node.param
    x = inputs[0]
    if p.split is not None:
        rotated = rotary_width(node, x)
        return p.split if len(x.shape) >= 1 and rotated == 2 * p.split <= x.shape[-1] else None
    bounds = inputs[3:]
    if any(t.host is None for t in bounds) or len(x.shape) < 1:
        return None
    dim = x.shape[-1]
    index = np.broadcast_to(np.arange(dim, dtype=np.int32), x.shape)
    try:
        hi = strided_slice(p.slice_hi, [index, *(t.host for t in bounds[:p.n_hi])])
        lo = strided_slice(p.slice_lo, [index, *(t.host for t in bounds[p.n_hi:])])
    except (IndexError, ValueError, TypeError):
        return None
    split = lo.shape[-1] if lo.ndim == index.ndim else -1
    if p.concat_axis not in (-1, len(x.shape) - 1) or not 0 < split < dim:
        return None
    if hi.shape != x.shape[:-1] + (dim - split,) or lo.shape != x.shape[:-1] + (split,):
        return None
    if not (np.array_equal(hi, np.broadcast_to(np.arange(split, dim), hi.shape))
            and np.array_equal(lo, np.broadcast_to(np.arange(split), lo.shape))):
        return None
    return split


def rotate_half_split(node: Node, inputs: list[Tensor]) -> int | None:
    """The split of a ROPE node in the form one kernel takes: x (1, seq, heads, dim), cos and sin one
    row of the rotated width per position (shared by the heads), the slices a rotate-half; else None."""
    x, cos, sin = inputs[:3]
    if len(x.shape) != 4 or x.shape[0] != 1:
        return None
    row = (1, x.shape[1], 1, rotary_width(node, x))
    if any(tuple(t.shape) not in (row, row[1:]) for t in (cos, sin)):
        return None
    return rope_split(node, inputs)


def rows_error(node: Node, inputs: list[Tensor]) -> ModelFormatError:
    """For a ROPE node with no exported ops to fall back on (MNN's RoPE op, rewritten at load) whose
    inputs are not in the form rotate_half_split takes."""
    x, cos, sin = inputs[:3]
    return ModelFormatError(f"RoPE of x {x.shape} with one (cos, sin) row of {rotary_width(node, x)} per "
                            f"position, got cos {cos.shape} and sin {sin.shape}", field=node.name)
