"""The OpenCL backend's op table: op type -> Execution class, merged from each family file's
`EXECUTIONS` (a new op of a family touches only that family's file here). RoPE, ExpertAdd and
SparseMoE are fused node types (runtime/fusion.py): listing them opts this backend into those
rewrites."""

from mnngpu.backend import merged_table
from mnngpu.backends.opencl.ops import (
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
