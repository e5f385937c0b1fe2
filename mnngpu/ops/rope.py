"""Rotary position embedding: the engine's fused rotate-half node (runtime/fusion.py matches the
exported pattern and checks its split at resize). MNN has its own RoPE op (306), which is not
this node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mnngpu.ops.common import FUSED_PREFIX, OpType, same
from mnngpu.ops.movement import strided_slice

if TYPE_CHECKING:
    from mnngpu.backend import Node, Tensor

ROPE = FUSED_PREFIX + "RoPE"

ROWS = {
    ROPE: OpType(same, fuses="x*cos + concat(-x[..., s:], x[..., :s])*sin (rotate-half)"),
}


@dataclass
class RoPEParam:
    """The rotate-half pattern. `ops` are the original ops (global tensor ids); `inputs` maps a
    fused-node input position to its global tensor id, `output` is the pattern's result id."""

    slice_hi: Node        # x[..., s:]  (negated)
    slice_lo: Node        # x[..., :s]
    n_hi: int             # bound inputs of slice_hi (after x); slice_lo's follow them
    concat_axis: int
    ops: list = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    output: int = -1


def rope_split(node: Node, inputs: list[Tensor]) -> int | None:
    """The split point s of a fused RoPE node at resize, or None when its slices and concat are not
    x[..., s:] and x[..., :s] along the last axis (then evaluate `param.ops` as exported)."""
    p: RoPEParam = node.param
    x = inputs[0]
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
