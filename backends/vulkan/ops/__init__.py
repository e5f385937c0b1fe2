"""The Vulkan backend's op table: op type -> Execution class, merged from each family file's
`EXECUTIONS` (a new op of a family touches only that family's file here). LinearGroup, GatedLinear
and RoPE are fused node types (runtime/fusion.py), as are ExpertAdd and SparseMoE: listing them
opts this backend into those rewrites."""

from mnngpu.backend import merged_table
from mnngpu.backends.vulkan.ops import (
    attention,
    elementwise,
    linear,
    linear_attention,
    movement,
    norm,
    rope,
    routing,
)

FAMILIES = (movement, elementwise, linear, norm, attention, linear_attention, rope, routing)
EXECUTIONS = merged_table(FAMILIES)
