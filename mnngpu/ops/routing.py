"""The MoE router's ops: Softmax, TopKV2 and Reduction, MNN's MoE op, and the engine's two
nodes that run it (runtime/moe.py): the EXPERT_ADD chain over the inlined expert subgraphs, which
runs every expert for every token, and SPARSE_MOE, one node that runs only the chosen experts on
a backend whose op table lists it.

A device kernel views its input as (outer, n, inner), n the extent it works along, over one
contiguous run of axes: `layout` gives that view and `decline` the cases a device kernel does
not take (they run on the CPU backup, said by placement), written once for every device backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mnngpu.errors import ModelFormatError
from mnngpu.ops.common import ALWAYS, FLOAT, FUSED_PREFIX, INT, OpType, Shape, host_values, same

if TYPE_CHECKING:
    from mnngpu.backend import Node, Tensor

EXPERT_ADD = FUSED_PREFIX + "ExpertAdd"
SPARSE_MOE = FUSED_PREFIX + "SparseMoE"
ROUTING_OPS = ("Softmax", "TopKV2", "Reduction", EXPERT_ADD)
# Reduction operations the kernels run, and the code they take (shaders: reduction)
REDUCE_CODES = {"SUM": 0, "MEAN": 1, "MAXIMUM": 2, "MINIMUM": 3, "PROD": 4}
REDUCE = {"SUM": np.sum, "MEAN": np.mean, "MAXIMUM": np.max, "MINIMUM": np.min, "PROD": np.prod,
          "ASUM": lambda x, axis, keepdims: np.abs(x).sum(axis=axis, keepdims=keepdims),
          "SUMSQ": lambda x, axis, keepdims: np.square(x).sum(axis=axis, keepdims=keepdims)}


# ---- host rules ----------------------------------------------------------------------------------------

def softmax(node, inputs):
    x = inputs[0].astype(FLOAT, copy=False)
    axis = int(node.param.axis) if node.param is not None else -1
    shifted = np.exp(x - x.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)


def top_k_axis(inputs, rank: int) -> tuple[int, int]:
    """(k, axis) of a TopKV2: k from input 1, the axis from input 2, else the last."""
    k = int(np.asarray(inputs[1]).reshape(-1)[0])
    axis = int(np.asarray(inputs[2]).reshape(-1)[0]) if len(inputs) > 2 else rank - 1
    return k, axis % rank


def top_k(node, inputs):
    """(values, indices int32) of the k largest (smallest with largest=false) along the axis,
    best first; equal values keep the lower index first."""
    x = inputs[0]
    k, axis = top_k_axis(inputs, x.ndim)
    largest = getattr(node.param, "largest", True) if node.param is not None else True
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    indices = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, indices, axis=axis), indices.astype(INT)


def reduction_axes(node, inputs, rank: int) -> tuple[int, ...]:
    """A Reduction's axes: from input 1, else the param's dim; none given means every axis."""
    axes = np.asarray(inputs[1]).reshape(-1) if len(inputs) > 1 else (node.param.dim or [])
    return tuple(sorted({int(a) % rank for a in axes})) if len(axes) else tuple(range(rank))


def reduction(node, inputs):
    x = inputs[0]
    func = REDUCE.get(node.param.operation)
    if func is None:
        raise ModelFormatError(f"Reduction operation {node.param.operation} is not supported", field=node.name)
    axes = reduction_axes(node, inputs, x.ndim)
    return np.asarray(func(x, axis=axes, keepdims=bool(node.param.keepDims))).astype(x.dtype, copy=False)


def expert_add(node, inputs):
    """The engine's EXPERT_ADD node (runtime/moe.py): [acc +] w * y, where w per token is the
    routing weight the router gave expert `param.expert` (zero where it did not select it)."""
    y, weights, selected = inputs[:3]
    top_k = node.param.top_k
    chosen = selected.reshape(-1, top_k) == node.param.expert
    w = np.where(chosen, weights.reshape(-1, top_k), 0).sum(axis=1).astype(FLOAT)
    out = y * w[:, None]
    return out + inputs[3] if len(inputs) > 3 else out


# ---- shape rules ---------------------------------------------------------------------------------------

def top_k_rule(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """TopKV2: values and int32 indices, the axis cut to k."""
    x = inputs[0]
    k, axis = top_k_axis([None, *host_values(node, inputs, 1)], len(x.shape))
    if not 0 < k <= x.shape[axis]:
        raise ModelFormatError(f"TopKV2 k must be in [1, {x.shape[axis]}], got {k}", field=node.name)
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [(shape, x.dtype), (shape, INT)]


def reduction_rule(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    x = inputs[0]
    axes = reduction_axes(node, [None, *host_values(node, inputs, 1)], len(x.shape))
    keep = bool(node.param.keepDims)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
    return [(shape, x.dtype)]


def expert_add_rule(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """EXPERT_ADD (runtime/moe.py): the expert output's (rows, H), once the routing holds top_k
    weights and ids for each of those rows."""
    y = inputs[0]
    _check_routing(node, y, inputs[1:3], "expert output")
    if len(inputs) > 3 and inputs[3].shape != y.shape:
        raise ModelFormatError(f"a MoE sum of the expert output's shape {y.shape}, got {inputs[3].shape}",
                               field=node.name)
    return [(y.shape, y.dtype)]


def sparse_moe_rule(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """SPARSE_MOE (runtime/moe.py): the hidden rows' (rows, H), top_k routing entries per row."""
    hidden = inputs[0]
    _check_routing(node, hidden, inputs[1:3], "hidden input")
    return [(hidden.shape, hidden.dtype)]


def _check_routing(node: Node, rows: Tensor, routing: list[Tensor], what: str) -> None:
    weights, selected = routing
    want = (rows.shape[0] if len(rows.shape) == 2 else -1) * node.param.top_k
    if weights.size != want or selected.size != want:
        raise ModelFormatError(f"a MoE {what} of shape (rows, hidden) and top_k={node.param.top_k} routing "
                               f"entries per row, got {what} {rows.shape}, weights {weights.shape} and expert ids "
                               f"{selected.shape}", field=node.name)


# ---- what the device kernels take ----------------------------------------------------------------------

def layout(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(outer, n, inner) of `shape` around the contiguous `axes`; None when they are not contiguous."""
    if not axes or list(axes) != list(range(axes[0], axes[-1] + 1)):
        return None
    first, last = axes[0], axes[-1] + 1
    return _size(shape[:first]), _size(shape[first:last]), _size(shape[last:])


def _size(dims) -> int:
    return int(np.prod(dims, dtype=np.int64))


def axes_of(node: Node, inputs: list[Tensor]) -> tuple[int, ...]:
    """The axes the op works along (its inputs beyond the first are host values by now)."""
    rank = len(inputs[0].shape)
    values = [None, *(t.host for t in inputs[1:])]
    if node.type == "Softmax":
        return ((int(node.param.axis) if node.param is not None else -1) % rank,)
    if node.type == "TopKV2":
        return (top_k_axis(values, rank)[1],)
    return reduction_axes(node, values, rank)


def _float(tensor: Tensor) -> bool:
    return np.dtype(tensor.dtype) == np.float32


def decline(inputs: list[Tensor], outputs: list[Tensor], node: Node) -> str | None:
    """Why a device kernel cannot run this routing op; None when it can."""
    if node.type == EXPERT_ADD:
        y, weights, selected = inputs[:3]
        if not (_float(y) and _float(weights)) or np.dtype(selected.dtype) != np.int32:
            return "ExpertAdd kernels take float expert outputs and weights and int32 expert ids"
        return None
    if not _float(inputs[0]):
        return f"{node.type} kernels run on float32 tensors, got {inputs[0].dtype}"
    if any(t.host is None for t in inputs[1:]):
        return "k or axes computed on the device"
    if node.type == "TopKV2" and node.param is not None and not node.param.largest:
        return "TopKV2 kernels select the largest values"
    if node.type == "Reduction" and node.param.operation not in REDUCE_CODES:
        return f"no Reduction kernel for {node.param.operation}"
    if layout(inputs[0].shape, axes_of(node, inputs)) is None:
        return "the reduced axes are not contiguous"
    return None


def top_k_count(inputs: list[Tensor]) -> int:
    return top_k_axis([None, inputs[1].host], len(inputs[0].shape))[0]


ROWS = {
    "Softmax": OpType(same, softmax, param="Axis"),
    "TopKV2": OpType(top_k_rule, top_k, param="TopKV2", min_inputs=2),
    "Reduction": OpType(reduction_rule, reduction, param="ReductionParam", param_required=ALWAYS),
    # inlined at load (runtime/moe.py): its expert subgraphs' ops and an EXPERT_ADD chain run it
    "MoE": OpType(same, param="Extra", param_required=ALWAYS, min_inputs=3, runs_as=EXPERT_ADD),
    EXPERT_ADD: OpType(expert_add_rule, expert_add, min_inputs=3,
                       fuses="MNN's MoE op: acc + (routing weight of expert e) * expert_e(x)"),
    SPARSE_MOE: OpType(sparse_moe_rule, min_inputs=3,
                       fuses="MNN's MoE op: the sum over the top_k chosen experts only, w * expert(x)"),
}


EXPERT_PREFIX = "/expert/"   # every inlined expert op's name starts with its subgraph's, /expert/{layer}_{i}


def is_expert_op(name: str) -> bool:
    """Whether a node is one of an inlined expert's ops (a backend that packs the experts of a
    SPARSE_MOE node together leaves their Convolutions unpacked at load)."""
    return name.startswith(EXPERT_PREFIX)


@dataclass(frozen=True)
class MoEParam:
    num_experts: int
    top_k: int
    layer_id: int


@dataclass(frozen=True)
class ExpertAddParam:
    """The EXPERT_ADD node: inputs [expert output (seq, H), weights, selected(, acc)]; weights and
    selected hold top_k entries per row."""

    expert: int
    top_k: int
    moe: str = ""                   # the MoE op this expert belongs to
    hidden: int = -1                # the tensor the expert reads
    ops: tuple[str, ...] = ()       # the names of the expert's inlined ops


@dataclass
class SparseExpert:
    """One expert of a SPARSE_MOE node: out = down(up * silu(gate)), [gate | up] = gate_up(x)."""

    gate_up: Node       # Convolution, 2 * width outputs
    down: Node          # Convolution, width inputs
    gate_first: bool    # the gate is gate_up's first half (the exporter's chunk(2) order)


@dataclass
class SparseMoEParam:
    """SPARSE_MOE: inputs [hidden (rows, H), routing weights (.., rows, top_k), expert ids
    (.., rows, top_k) int32]; out[t] = sum_j w[t, j] * expert_{ids[t, j]}(hidden[t])."""

    num_experts: int
    top_k: int
    experts: list[SparseExpert]
    members: list[Node] = field(default_factory=list)   # every expert's Convolutions, for the packing


def raw_expert_weights(experts: list[SparseExpert]) -> tuple[list, list]:
    """Every expert's (gate_up, down) raw weights, as the load left them (a backend that stacks the
    experts leaves them unpacked), else decoded again from the weight file."""
    layers = [tuple(layer.weights.get("weight") or layer.source()["weight"] for layer in (e.gate_up, e.down))
              for e in experts]
    return [gate_up for gate_up, _ in layers], [down for _, down in layers]


def unstackable(gate_ups: list, downs: list, experts: list[SparseExpert]) -> str | None:
    """Why the experts' layers cannot be stacked in one buffer each (they differ in kind, shape or
    gate half); None when they can."""
    for layers in (gate_ups, downs):
        first = layers[0]
        if any((w.oc, w.ic, w.block_size, w.bits, w.bias is None)
               != (first.oc, first.ic, first.block_size, first.bits, first.bias is None) for w in layers):
            return "its experts' layers differ in kind or shape"
    if gate_ups[0].oc % 2 or len({expert.gate_first for expert in experts}) != 1:
        return "its experts differ in which half of gate_up is the gate"
    return None


def drop_raw_weights(experts: list[SparseExpert]) -> None:
    """Once a backend has stacked the experts: their raw weights go (a CPU backup decodes them again)."""
    for expert in experts:
        expert.gate_up.weights.pop("weight", None)
        expert.down.weights.pop("weight", None)
