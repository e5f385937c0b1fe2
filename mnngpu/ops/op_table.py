"""The op table: every op type the engine knows, merged from the op family files (mnngpu/ops/).

For each op type: its shape rule, its numpy semantics where it can be folded on the host, the
MNN parameter table and inputs validate expects, how its weights are decoded at load, and, for
the engine's own fused node types (runtime/fusion.py), what they replace. Which backends
implement an op is each backend's `executions` table, keyed by these names
(`mnngpu.backend.registry.implemented_by`).
docs/ops.md lists what adding an op takes.

Fused node types carry FUSED_PREFIX: no MNN op type contains a dot, so a graph can never name
one (MNN has its own RoPE op, 306, which is not the engine's rotate-half node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.format.weights import WeightFile
from mnngpu.ops import (
    attention,
    elementwise,
    linear,
    linear_attention,
    movement,
    norm,
    pooling,
    rope,
    routing,
    shape,
)
from mnngpu.ops.common import ALWAYS, FUSED_PREFIX, WITHOUT_SECOND_INPUT, OpType
from mnngpu.ops.linear import GATED_LINEAR, LINEAR_GROUP
from mnngpu.ops.rope import ROPE, RoPEParam
from mnngpu.ops.routing import EXPERT_ADD, SPARSE_MOE

if TYPE_CHECKING:
    from mnngpu.backend import Node, Tensor

__all__ = ["ALWAYS", "EXPERT_ADD", "FUSED_PREFIX", "GATED_LINEAR", "LINEAR_GROUP", "OPS", "ROPE", "SOURCES",
           "SPARSE_MOE",
           "WITHOUT_SECOND_INPUT", "OpType", "decode_weights", "evaluate", "foldable",
           "graph_op_types", "has_weights", "infer", "spec"]

FAMILIES = (shape, movement, elementwise, linear, norm, attention, linear_attention, rope, pooling, routing)
OPS: dict[str, OpType] = {name: op for family in FAMILIES for name, op in family.ROWS.items()}

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


def has_weights(op_type: str) -> bool:
    """Whether ops of this type carry weights decoded at load."""
    op = OPS.get(op_type)
    return op is not None and op.weights is not None


def decode_weights(op_type: str, param: Any, name: str, weights: WeightFile | None) -> dict[str, Any]:
    """An op's weights decoded from its table and the weight file ({} for an op without weights)."""
    op = OPS.get(op_type)
    return op.weights(weights, param, name) if op is not None and op.weights is not None else {}


def graph_op_types() -> frozenset[str]:
    """The op types a graph may name: the table less the engine's own fused nodes."""
    return frozenset(name for name, op in OPS.items() if not op.fuses)


def evaluate_rope_ops(node: Node, values: list[np.ndarray]) -> np.ndarray:
    """The fused RoPE's result computed op by op as exported (values: the fused node's inputs)."""
    p: RoPEParam = node.param
    env = dict(zip(p.inputs, values))
    for op in p.ops:
        results = evaluate(op.node, [env[t] for t in op.inputs])
        env.update(zip(op.outputs, results))
    return env[p.output]
