"""The CPU backend's op table: op type -> Execution class, merged from each family file's
`EXECUTIONS` (a new op of a family touches only that family's file here).

Every op of the core table that has a host rule runs through CPUHostOp (ops/base.py), so the CPU
takes every op a graph may name; the other families' rows give the heavy ones a kernel.
LinearGroup, GatedLinear and RoPE are fused node types (runtime/fusion.py): listing them opts this
backend into those rewrites. Two variants the table cannot key come from its entries'
`variant_for`: an encoder's Attention (CPUEncoderAttention) and a windowed Convolution
(CPUConvolution).
"""

from mnngpu.backend import merged_table
from mnngpu.backends.cpu.ops import (
    attention,
    base,
    elementwise,
    linear,
    linear_attention,
    movement,
    norm,
    rope,
    routing,
)

FAMILIES = (base, movement, elementwise, linear, norm, attention, linear_attention, rope, routing)
EXECUTIONS = merged_table(FAMILIES)
