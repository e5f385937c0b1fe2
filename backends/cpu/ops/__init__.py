"""The CPU backend's op table: op type -> Execution class.

Every op of the core table that has a host rule runs through HostOpExecution (ops/base.py), so
the CPU takes every op a graph may name; the rows below give the heavy ones a kernel. LinearGroup,
GatedLinear and RoPE are fused node types (runtime/fusion.py): listing them opts this backend into
those rewrites. CPUBackend.onCreate picks two variants the table cannot key: encoder Attention
(CPUEncoderAttention) and a windowed Convolution (CPUConvolution).
"""

from mnngpu.backends.cpu.ops.attention import CPUAttention
from mnngpu.backends.cpu.ops.base import HostOpExecution
from mnngpu.backends.cpu.ops.elementwise import BinaryExecution, UnaryExecution
from mnngpu.backends.cpu.ops.linear import CPUGatedLinear, CPULinear
from mnngpu.backends.cpu.ops.linear_attention import CPULinearAttention
from mnngpu.backends.cpu.ops.movement import ViewExecution
from mnngpu.backends.cpu.ops.norm import CPULayerNorm
from mnngpu.backends.cpu.ops.rope import CPURoPE
from mnngpu.backends.cpu.ops.routing import CPUSparseMoE
from mnngpu.ops.linear import GATED_LINEAR, LINEAR_GROUP
from mnngpu.ops.movement import VIEW_OPS
from mnngpu.ops.op_table import OPS
from mnngpu.ops.rope import ROPE
from mnngpu.ops.routing import SPARSE_MOE

EXECUTIONS = {
    **{name: HostOpExecution for name, op in OPS.items() if op.host and not op.shape_only},
    **{op: ViewExecution for op in VIEW_OPS},
    "BinaryOp": BinaryExecution,
    "UnaryOp": UnaryExecution,
    "Convolution": CPULinear,
    LINEAR_GROUP: CPULinear,
    GATED_LINEAR: CPUGatedLinear,
    "LayerNorm": CPULayerNorm,
    "Attention": CPUAttention,
    "LinearAttention": CPULinearAttention,
    ROPE: CPURoPE,
    SPARSE_MOE: CPUSparseMoE,
}
