"""The op table: every op type the engine knows, in one place.

For each op type: its shape rule (runtime/shapes.py), its numpy semantics where it can be
folded on the host (runtime/host_ops.py), the MNN parameter table and inputs validate expects,
and, for the engine's own fused node types (runtime/fusion.py), what they replace. Which
backends implement an op is each backend's `executions` table, keyed by these names
(`implemented_by`). Adding an op is one entry here plus one Execution per backend.

Fused node types carry FUSED_PREFIX: no MNN op type contains a dot, so a graph can never name
one (MNN has its own RoPE op, 306, which is not the engine's rotate-half node).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mnngpu.backend import REGISTRY, Node, Tensor, backend_class
from mnngpu.errors import BackendUnavailableError, ModelFormatError
from mnngpu.runtime import host_ops, shapes

FUSED_PREFIX = "fused."
LINEAR_GROUP, GATED_LINEAR, ROPE, EXPERT_ADD = (FUSED_PREFIX + name for name in
                                               ("LinearGroup", "GatedLinear", "RoPE", "ExpertAdd"))

ShapeRule = Callable[[Node, list[Tensor]], list[tuple[tuple[int, ...], np.dtype]]]
HostRule = Callable[[Node, list[np.ndarray]], np.ndarray]

# when validate insists on the parameter table: always, or only when the op has no second input
# to read its values from (a Reshape's target shape, an Unsqueeze's axes)
ALWAYS, WITHOUT_SECOND_INPUT = "always", "without a second input"


@dataclass(frozen=True)
class OpType:
    shape: ShapeRule
    host: HostRule | None = None   # numpy semantics: folded at resize when every input is known on the host
                                   # (a tuple of arrays for an op with several outputs)
    shape_only: bool = False       # reads only its input's shape: always folded
    param: str | None = None       # the OpParameter table MNN pairs with this op type
    param_required: str | None = None
    min_inputs: int = 1
    fuses: str = ""                # an engine-made node: the exported pattern it replaces
    runs_as: str = ""              # an op the loader rewrites into other nodes: the node type that runs it


OPS: dict[str, OpType] = {
    "Shape": OpType(shapes.shape_of, host_ops.shape, shape_only=True),
    "Rank": OpType(shapes.shape_of, host_ops.rank, shape_only=True),
    "Size": OpType(shapes.shape_of, host_ops.size, shape_only=True),
    "Reshape": OpType(shapes.reshape, host_ops.reshape, param="Reshape", param_required=WITHOUT_SECOND_INPUT),
    "ConvertTensor": OpType(shapes.same, host_ops.identity, param="TensorConvertInfo"),
    "Identity": OpType(shapes.same, host_ops.identity),
    "BinaryOp": OpType(shapes.binary, host_ops.binary_op, param="BinaryOp", param_required=ALWAYS, min_inputs=2),
    "UnaryOp": OpType(shapes.same, host_ops.unary_op, param="UnaryOp", param_required=ALWAYS),
    "Cast": OpType(shapes.cast, host_ops.cast, param="CastParam", param_required=ALWAYS),
    "Squeeze": OpType(shapes.by_evaluation, host_ops.squeeze, param="SqueezeParam"),
    "Unsqueeze": OpType(shapes.by_evaluation, host_ops.unsqueeze, param="SqueezeParam",
                        param_required=WITHOUT_SECOND_INPUT),
    "StridedSlice": OpType(shapes.by_evaluation, host_ops.strided_slice, param="StridedSliceParam", min_inputs=3),
    "GatherV2": OpType(shapes.gather, host_ops.gather, param="GatherV2", min_inputs=2),
    "Gather": OpType(shapes.gather, host_ops.gather, min_inputs=2),
    "Concat": OpType(shapes.concat, host_ops.concat, param="Axis", param_required=ALWAYS),
    "SliceTf": OpType(shapes.by_evaluation, host_ops.slice_tf, min_inputs=3),
    "Transpose": OpType(shapes.by_evaluation, host_ops.transpose, min_inputs=2),
    "Permute": OpType(shapes.by_evaluation, host_ops.permute, param="Permute", param_required=ALWAYS),
    "Unpack": OpType(shapes.by_evaluation, host_ops.unpack, param="Axis", param_required=ALWAYS),
    "Im2Col": OpType(shapes.by_evaluation, host_ops.im2col, param="Convolution2D", param_required=ALWAYS),
    "Eltwise": OpType(shapes.eltwise, host_ops.eltwise, param="Eltwise", param_required=ALWAYS, min_inputs=2),
    "Convolution": OpType(shapes.convolution, param="Convolution2D", param_required=ALWAYS),
    "LayerNorm": OpType(shapes.same, param="LayerNorm", param_required=ALWAYS),
    "Attention": OpType(shapes.attention, param="AttentionParam", param_required=ALWAYS, min_inputs=3),
    "Softmax": OpType(shapes.same, host_ops.softmax, param="Axis"),
    "MatMul": OpType(shapes.matmul, host_ops.matmul, param="MatMul", min_inputs=2),
    "Pooling": OpType(shapes.by_evaluation, host_ops.pooling, param="Pool", param_required=ALWAYS),
    "TopKV2": OpType(shapes.top_k, host_ops.top_k, param="TopKV2", min_inputs=2),
    "Reduction": OpType(shapes.reduction, host_ops.reduction, param="ReductionParam", param_required=ALWAYS),
    # inlined at load (runtime/moe.py): its expert subgraphs' ops and an EXPERT_ADD chain run it
    "MoE": OpType(shapes.same, param="Extra", param_required=ALWAYS, min_inputs=3, runs_as=EXPERT_ADD),
    LINEAR_GROUP: OpType(shapes.linear_group, fuses="Convolutions reading the same input (q, k, v)"),
    GATED_LINEAR: OpType(shapes.gated_linear, fuses="MUL_SILU(up(x), gate(x)) of two Convolutions"),
    ROPE: OpType(shapes.same, fuses="x*cos + concat(-x[..., s:], x[..., :s])*sin (rotate-half)"),
    EXPERT_ADD: OpType(shapes.expert_add, host_ops.expert_add, min_inputs=3,
                       fuses="MNN's MoE op: acc + (routing weight of expert e) * expert_e(x)"),
}

# The graph's sources: no op runs for them (the Session binds inputs, constants are host values).
SOURCES = {"Input": "Input", "Const": "Blob"}


def spec(node: Node) -> OpType:
    found = OPS.get(node.type)
    if found is None:
        raise ModelFormatError(f"op type {node.type} is not supported by mnngpu", field=node.name)
    return found


def infer(node: Node, inputs: list[Tensor]) -> list[tuple[tuple[int, ...], np.dtype]]:
    """Each output's (shape, dtype)."""
    return spec(node).shape(node, inputs)


def host_evaluated() -> frozenset[str]:
    """The op types with numpy semantics (folded when their inputs are host-known)."""
    return frozenset(name for name, op in OPS.items() if op.host is not None)


def foldable(node: Node, inputs: list[Tensor]) -> bool:
    op = OPS.get(node.type)
    if op is None or op.host is None:
        return False
    return op.shape_only or all(t.host is not None for t in inputs)


def evaluate(node: Node, values: list[np.ndarray]) -> list[np.ndarray]:
    """Run one host-evaluable op on numpy values; returns its outputs."""
    op = OPS.get(node.type)
    if op is None or op.host is None:
        raise ModelFormatError(f"op type {node.type} cannot be evaluated on the host", field=node.name)
    result = op.host(node, values)
    return list(result) if isinstance(result, tuple) else [result]


def graph_op_types() -> frozenset[str]:
    """The op types a graph may name: the table less the engine's own fused nodes."""
    return frozenset(name for name, op in OPS.items() if not op.fuses)


def backend_op_tables() -> dict[str, frozenset[str] | None]:
    """Each registered backend type's op types (its `executions` keys); None where its package is missing."""
    tables: dict[str, frozenset[str] | None] = {}
    for backend_type in REGISTRY:
        try:
            tables[backend_type] = frozenset(backend_class(backend_type).executions)
        except BackendUnavailableError:
            tables[backend_type] = None
    return tables


def implemented_by(op_type: str) -> list[str]:
    """The backend types whose op table has `op_type` (backends whose package is missing are left out)."""
    return [backend_type for backend_type, table in backend_op_tables().items()
            if table is not None and op_type in table]
