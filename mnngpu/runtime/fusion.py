"""Graph rewrites that merge op patterns into fused nodes, for backends that have kernels for them.

`fuse(ops, supported, graph_outputs)` returns a new op list; a pattern is rewritten only when
its fused type is in `supported` (the backend's `executions` table), so a backend without the
kernels sees the graph as exported. The fused node types (each named with FUSED_PREFIX):

* "GatedLinear": MUL_SILU(up(x), gate(x)) of two Convolutions reading the same x ->
  one node, members [gate, up], output up*silu(gate). Saves the [seq, intermediate] tensors.
* "LinearGroup": Convolutions reading the same x (q/k/v) -> one node with one output per
  member, so a backend can run them in one kernel launch.
* "SparseMoE": one MoE op's inlined experts and EXPERT_ADD chain -> one node that runs only the
  experts the router chose (runtime/moe.py: `sparse_experts`, which checks each expert's form).
* "RoPE": x*cos + concat(-x[..., s:], x[..., :s])*sin (rotate-half, s = head_dim/2) -> one
  node, inputs [x, cos, sin, *the two slices' bound inputs]. The split point is only known at
  resize: `rope_split()` checks the slices then; `RoPEParam.ops` keeps the original ops so a
  backend can evaluate them as exported when the check fails.

Every fused node keeps the original nodes (`param.members` / `param.ops`), with their packed
weights; the op family files (mnngpu/ops/) name the fused types and give their shape rules.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend import Node
from mnngpu.ops.linear import FusedLinearParam
from mnngpu.ops.op_table import FUSED_PREFIX, GATED_LINEAR, LINEAR_GROUP, ROPE  # noqa: F401 (fusion.ROPE, ...)
from mnngpu.ops.rope import RoPEParam
from mnngpu.ops.routing import SPARSE_MOE
from mnngpu.runtime.graph import GraphOp
from mnngpu.runtime.moe import sparse_experts


class _Graph:
    """Who produces and who reads each tensor id."""

    def __init__(self, ops, graph_outputs: set[int]):
        self.ops = list(ops)
        self.graph_outputs = graph_outputs
        self.producer: dict[int, int] = {}
        self.readers: dict[int, list[int]] = {}
        for index, op in enumerate(self.ops):
            for tensor in op.outputs:
                self.producer[tensor] = index
            for tensor in op.inputs:
                self.readers.setdefault(tensor, []).append(index)

    def op_of(self, tensor: int):
        index = self.producer.get(tensor)
        return None if index is None else self.ops[index]

    def only_reader_is(self, tensor: int, op) -> bool:
        readers = self.readers.get(tensor, [])
        return tensor not in self.graph_outputs and len(readers) == 1 and self.ops[readers[0]] is op


def _is(op, op_type: str, binary: str | None = None) -> bool:
    if op is None or op.node.type != op_type:
        return False
    return binary is None or getattr(op.node.param, "opType", None) == binary


def fuse(ops: list[GraphOp], supported: set[str], graph_outputs: set[int],
         constants: dict[int, np.ndarray] | None = None) -> list[GraphOp]:
    """The op list with every supported pattern replaced by its fused node (`constants`: the
    graph's constant values, which the SparseMoE check reads)."""
    if SPARSE_MOE in supported:
        ops = sparse_experts(ops, constants or {})
    if GATED_LINEAR in supported:
        ops = _fuse_gated(_Graph(ops, graph_outputs))
    if LINEAR_GROUP in supported:
        ops = _fuse_groups(_Graph(ops, graph_outputs))
    if ROPE in supported:
        ops = _fuse_rope(_Graph(ops, graph_outputs))
    return ops


def _fuse_gated(graph: _Graph) -> list:
    replace: dict[int, object] = {}
    drop: set[int] = set()
    for op in graph.ops:
        if not _is(op, "BinaryOp", "MUL_SILU") or len(op.inputs) != 2:
            continue
        up, gate = (graph.op_of(t) for t in op.inputs)
        if not (_is(up, "Convolution") and _is(gate, "Convolution")) or up is gate:
            continue
        if up.inputs != gate.inputs or not all(graph.only_reader_is(t, op) for t in op.inputs):
            continue
        fused = GraphOp(Node(GATED_LINEAR, op.node.name, FusedLinearParam([gate.node, up.node])),
                        list(gate.inputs), list(op.outputs))
        first, last = sorted((graph.producer[op.inputs[0]], graph.producer[op.inputs[1]]))
        replace[id(graph.ops[first])] = fused
        drop |= {id(graph.ops[last]), id(op)}
    return [replace.get(id(op), op) for op in graph.ops if id(op) not in drop]


def _fuse_groups(graph: _Graph) -> list:
    groups: dict[tuple[int, ...], list] = {}
    for op in graph.ops:
        if _is(op, "Convolution") and len(op.inputs) == 1:
            groups.setdefault(tuple(op.inputs), []).append(op)
    replace: dict[int, object] = {}
    drop: set[int] = set()
    for members in groups.values():
        if len(members) < 2:
            continue
        outputs = [t for member in members for t in member.outputs]
        fused = GraphOp(Node(LINEAR_GROUP, members[0].node.name, FusedLinearParam([m.node for m in members])),
                        list(members[0].inputs), outputs)
        replace[id(members[0])] = fused
        drop |= {id(m) for m in members[1:]}
    return [replace.get(id(op), op) for op in graph.ops if id(op) not in drop]


def _fuse_rope(graph: _Graph) -> list:
    replace: dict[int, object] = {}
    drop: set[int] = set()
    for op in graph.ops:
        match = _match_rope(graph, op)
        if match is None:
            continue
        x, cos, sin, hi, lo, concat, pattern = match
        param = RoPEParam(slice_hi=hi.node, slice_lo=lo.node, n_hi=len(hi.inputs) - 1,
                          concat_axis=int(concat.node.param.axis))
        inputs = [x, cos, sin, *hi.inputs[1:], *lo.inputs[1:]]
        param.ops, param.inputs, param.output = [graph.ops[i] for i in sorted(pattern)], inputs, op.outputs[0]
        replace[id(op)] = GraphOp(Node(ROPE, op.node.name, param), inputs, list(op.outputs))
        drop |= {id(graph.ops[i]) for i in pattern if graph.ops[i] is not op}
    return [replace.get(id(op), op) for op in graph.ops if id(op) not in drop]


def _match_rope(graph: _Graph, add):
    """(x, cos, sin, slice_hi, slice_lo, concat, op indices) when `add` ends a rotate-half."""
    if not _is(add, "BinaryOp", "ADD") or len(add.inputs) != 2:
        return None
    for plain_t, rotated_t in (add.inputs, add.inputs[::-1]):
        plain, rotated = graph.op_of(plain_t), graph.op_of(rotated_t)
        if not (_is(plain, "BinaryOp", "MUL") and _is(rotated, "BinaryOp", "MUL")):
            continue
        for concat_t, sin in (rotated.inputs, rotated.inputs[::-1]):
            concat = graph.op_of(concat_t)
            if not _is(concat, "Concat") or len(concat.inputs) != 2:
                continue
            neg, lo = (graph.op_of(t) for t in concat.inputs)
            if not (_is(neg, "UnaryOp", "NEG") and _is(lo, "StridedSlice")):
                continue
            hi = graph.op_of(neg.inputs[0])
            if not _is(hi, "StridedSlice") or hi.inputs[0] != lo.inputs[0]:
                continue
            x = hi.inputs[0]
            if x not in plain.inputs or plain.inputs[0] == plain.inputs[1]:
                continue
            cos = plain.inputs[1] if plain.inputs[0] == x else plain.inputs[0]
            chain = [(plain_t, add), (rotated_t, add), (concat_t, rotated), (concat.inputs[0], concat),
                     (concat.inputs[1], concat), (neg.inputs[0], neg)]
            if all(graph.only_reader_is(t, reader) for t, reader in chain):
                pattern = {graph.producer[t] for t in (plain_t, rotated_t, concat_t, *concat.inputs,
                                                       neg.inputs[0])} | {graph.ops.index(add)}
                return x, cos, sin, hi, lo, concat, pattern
    return None
