"""The CUDA backend's op table: op type -> Execution class. The MoE router's ops have no kernels
here yet: CUDABackend.caps says why they run on the CPU backup."""

from mnngpu.backends.cuda.ops.attention import AttentionExecution
from mnngpu.backends.cuda.ops.elementwise import BinaryExecution, CastExecution, UnaryExecution
from mnngpu.backends.cuda.ops.linear import LinearExecution
from mnngpu.backends.cuda.ops.movement import ConcatExecution, IndexCopyExecution, ViewExecution
from mnngpu.backends.cuda.ops.norm import LayerNormExecution
from mnngpu.ops.movement import VIEW_OPS

EXECUTIONS = {
    **{op: ViewExecution for op in VIEW_OPS},
    "StridedSlice": IndexCopyExecution,
    "GatherV2": IndexCopyExecution,
    "Gather": IndexCopyExecution,
    "Concat": ConcatExecution,
    "BinaryOp": BinaryExecution,
    "UnaryOp": UnaryExecution,
    "Cast": CastExecution,
    "LayerNorm": LayerNormExecution,
    "Convolution": LinearExecution,
    "Attention": AttentionExecution,
}
