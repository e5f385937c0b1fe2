"""The Vulkan backend's op table: op type -> Execution class. LinearGroup, GatedLinear and RoPE
are fused node types (runtime/fusion.py), as are ExpertAdd and SparseMoE: listing them here opts this backend
into those rewrites."""

from mnngpu.backends.vulkan.ops.attention import AttentionOp
from mnngpu.backends.vulkan.ops.elementwise import VulkanBinary, VulkanCast, VulkanUnary
from mnngpu.backends.vulkan.ops.linear import VulkanLinear
from mnngpu.backends.vulkan.ops.linear_attention import VulkanLinearAttention
from mnngpu.backends.vulkan.ops.movement import VulkanConcat, VulkanGather, VulkanStridedSlice, VulkanView
from mnngpu.backends.vulkan.ops.norm import VulkanLayerNorm
from mnngpu.backends.vulkan.ops.rope import VulkanRoPE
from mnngpu.backends.vulkan.ops.routing import VulkanExpertAdd, VulkanRouting, VulkanSparseMoE
from mnngpu.ops.linear import GATED_LINEAR, LINEAR_GROUP
from mnngpu.ops.movement import VIEW_OPS
from mnngpu.ops.rope import ROPE
from mnngpu.ops.routing import EXPERT_ADD, SPARSE_MOE

EXECUTIONS = {
    "Convolution": VulkanLinear,
    LINEAR_GROUP: VulkanLinear,
    GATED_LINEAR: VulkanLinear,
    ROPE: VulkanRoPE,
    "LayerNorm": VulkanLayerNorm,
    "Attention": AttentionOp,
    "LinearAttention": VulkanLinearAttention,
    "BinaryOp": VulkanBinary,
    "UnaryOp": VulkanUnary,
    "Cast": VulkanCast,
    "StridedSlice": VulkanStridedSlice,
    "GatherV2": VulkanGather,
    "Gather": VulkanGather,
    "Concat": VulkanConcat,
    "Softmax": VulkanRouting,
    "TopKV2": VulkanRouting,
    "Reduction": VulkanRouting,
    EXPERT_ADD: VulkanExpertAdd,
    SPARSE_MOE: VulkanSparseMoE,
    **{op: VulkanView for op in VIEW_OPS},
}
