"""The OpenCL backend's op table: op type -> Execution class. RoPE, ExpertAdd and SparseMoE are
fused node types (runtime/fusion.py): listing them opts this backend into those rewrites."""

from mnngpu.backends.opencl.ops.attention import AttentionOp
from mnngpu.backends.opencl.ops.elementwise import BinaryExecution, CastExecution, UnaryExecution
from mnngpu.backends.opencl.ops.linear import LinearExecution
from mnngpu.backends.opencl.ops.linear_attention import LinearAttentionExecution
from mnngpu.backends.opencl.ops.movement import ConcatExecution, GatherCopyExecution, ViewExecution
from mnngpu.backends.opencl.ops.norm import LayerNormExecution
from mnngpu.backends.opencl.ops.rope import RoPEExecution
from mnngpu.backends.opencl.ops.routing import (
    ExpertAddExecution,
    ReductionExecution,
    SoftmaxExecution,
    SparseMoEExecution,
    TopKExecution,
)
from mnngpu.ops.movement import VIEW_OPS
from mnngpu.ops.rope import ROPE
from mnngpu.ops.routing import EXPERT_ADD, SPARSE_MOE

EXECUTIONS = {
    **{op: ViewExecution for op in VIEW_OPS},
    "StridedSlice": GatherCopyExecution,
    "GatherV2": GatherCopyExecution,
    "Gather": GatherCopyExecution,
    "Concat": ConcatExecution,
    "BinaryOp": BinaryExecution,
    "UnaryOp": UnaryExecution,
    "Cast": CastExecution,
    "LayerNorm": LayerNormExecution,
    "Convolution": LinearExecution,
    "Attention": AttentionOp,
    "LinearAttention": LinearAttentionExecution,
    ROPE: RoPEExecution,
    "Softmax": SoftmaxExecution,
    "TopKV2": TopKExecution,
    "Reduction": ReductionExecution,
    EXPERT_ADD: ExpertAddExecution,
    SPARSE_MOE: SparseMoEExecution,
}
