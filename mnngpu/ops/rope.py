"""Rotary position embedding: the engine's fused rotate-half node (runtime/fusion.py matches the
exported pattern and checks its split at resize). MNN has its own RoPE op (306), which is not
this node."""

from __future__ import annotations

from mnngpu.ops.common import FUSED_PREFIX, OpType, same

ROPE = FUSED_PREFIX + "RoPE"

ROWS = {
    ROPE: OpType(same, fuses="x*cos + concat(-x[..., s:], x[..., :s])*sin (rotate-half)"),
}
