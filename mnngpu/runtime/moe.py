"""MNN's MoE op: the router's choice applied to per-expert subgraphs, inlined into one graph,
and, for a backend whose op table has SPARSE_MOE, folded back into one node that runs only the
experts the router chose.

An export's MoE op (an `Extra` table with num_experts, top_k, layer_id) reads
[hidden (seq, H), routing weights (.., seq, top_k), selected experts (.., seq, top_k) int32]
and names one subgraph per expert, "/expert/{layer_id}_{i}" in Net.subgraphs, each taking the
hidden rows and returning (seq, H). MNN's runtime reads the selected ids on the host and runs
only those experts. Here the experts' ops are inlined into the main graph instead, and the MoE
op becomes a chain of EXPERT_ADD nodes: acc += w_e * expert_e(hidden), where w_e is the
routing weight of expert e for each token (zero where the router did not select e). Every
shape is fixed, so a device backend replays the same commands every token; the price of this
dense form is that every expert runs on every token (num_experts/top_k times the expert work of
a sparse run). It is what runs on a backend whose op table lacks SPARSE_MOE (CUDA, which also
runs the router's ops and EXPERT_ADD on the CPU backup), and for a MoE op whose experts have
another form than the one below.

`sparse_experts` (called by runtime/fusion.py for a backend that lists SPARSE_MOE: the CPU,
OpenCL and Vulkan; on the last two the routing stays on the device) replaces one MoE op's
inlined experts and EXPERT_ADD chain by a single SPARSE_MOE node, which runs only the chosen
experts, when every expert has the exporter's SwiGLU form: one gate_up Convolution, its output
cut into two halves, SiLU of the gate half times the up half, one down Convolution (views
between them). The node keeps each expert's two Convolution nodes (`members`, packed by the
backend at load) and which half is the gate, read from the slices' own bounds. A MoE op whose
experts have another form stays dense, said in one warning line.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mnngpu.backend import Node, Tensor, warn_once
from mnngpu.errors import ModelFormatError
from mnngpu.format import Net
from mnngpu.format.net import Op, SubGraph
from mnngpu.ops import op_table
from mnngpu.ops.common import shape_stand_in
from mnngpu.ops.movement import VIEW_OPS, strided_slice
from mnngpu.ops.op_table import EXPERT_ADD
from mnngpu.ops.routing import (
    EXPERT_PREFIX,
    SPARSE_MOE,
    ExpertAddParam,
    MoEParam,
    SparseExpert,
    SparseMoEParam,
)
from mnngpu.runtime.graph import GraphOp


def moe_param(net: Net, op: Op, where: str) -> MoEParam:
    attrs = {a.key: a.i for a in (getattr(op.param, "attr", None) or []) if a.key}
    missing = [key for key in ("num_experts", "top_k") if key not in attrs]
    if missing:
        raise ModelFormatError(f"expected the MoE op's Extra attributes num_experts and top_k, missing {missing}",
                               path=net.path, field=f"{where}.main.attr")
    param = MoEParam(int(attrs["num_experts"]), int(attrs["top_k"]), int(attrs.get("layer_id", 0)))
    if not 0 < param.top_k <= param.num_experts:
        raise ModelFormatError(f"expected 0 < top_k <= num_experts, got top_k {param.top_k} and num_experts "
                               f"{param.num_experts}", path=net.path, field=f"{where}.main.attr")
    return param


def expert_subgraphs(net: Net, op: Op, where: str) -> list[SubGraph]:
    """The MoE op's experts, in expert order; a missing or malformed one is a ModelFormatError
    naming the file and the subgraph."""
    param = moe_param(net, op, where)
    by_name = {graph.name: graph for graph in net.subgraphs}
    experts = []
    for expert in range(param.num_experts):
        name = f"{EXPERT_PREFIX}{param.layer_id}_{expert}"
        graph = by_name.get(name)
        field = f"subgraphs['{name}']"
        if graph is None:
            raise ModelFormatError(f"expected the expert subgraph {name} that MoE op {op.name} names "
                                   f"({len(net.subgraphs)} subgraphs in the file)", path=net.path, field=field)
        _check_expert(net, graph, field)
        experts.append(graph)
    return experts


def _check_expert(net: Net, graph: SubGraph, field: str) -> None:
    inputs = [o for o in graph.ops if o.type == "Input"]
    if len(graph.inputs) != 1 or len(graph.outputs) != 1 or len(inputs) != 1 \
            or inputs[0].outputs != graph.inputs:
        raise ModelFormatError(f"expected an expert subgraph with one Input op feeding its one input and one "
                               f"output, got inputs {graph.inputs}, outputs {graph.outputs} and "
                               f"{len(inputs)} Input ops", path=net.path, field=field)
    produced = set(graph.inputs)
    for position, sub_op in enumerate(graph.ops):
        for tensor in sub_op.inputs:
            if tensor not in produced:
                raise ModelFormatError(f"expected input tensor {tensor} of op {sub_op.name} to be produced by an "
                                       "earlier op", path=net.path, field=f"{field}.nodes[{position}]")
        produced.update(sub_op.outputs)
    if graph.outputs[0] not in produced:
        raise ModelFormatError(f"expected the output tensor {graph.outputs[0]} to be produced by an op",
                               path=net.path, field=f"{field}.outputs")


def inline_experts(net: Net) -> Net:
    """The graph with each MoE op replaced by its experts' ops and an EXPERT_ADD chain."""
    if not any(op.type == "MoE" for op in net.ops):
        return net
    tensor_names = list(net.tensor_names)
    ops: list[Op] = []
    for position, op in enumerate(net.ops):
        if op.type != "MoE":
            ops.append(op)
            continue
        where = f"oplists[{position}] ({op.name})"
        hidden, weights, selected = op.inputs[:3]
        acc = None
        experts = expert_subgraphs(net, op, where)
        top_k = moe_param(net, op, where).top_k
        for expert, graph in enumerate(experts):
            first = len(ops)
            output = _inline_expert(graph, hidden, tensor_names, ops)
            names = tuple(sub_op.name for sub_op in ops[first:])
            last = expert == len(experts) - 1
            target = op.outputs[0] if last else _new_tensor(tensor_names, f"{op.name}/sum{expert}")
            inputs = [output, weights, selected] + ([] if acc is None else [acc])
            ops.append(Op(EXPERT_ADD, f"{op.name}/expert{expert}", inputs, [target], "ExpertAddParam",
                          ExpertAddParam(expert, top_k, op.name, hidden, names)))
            acc = target
    return replace(net, ops=ops, tensor_names=tensor_names)


def _inline_expert(graph: SubGraph, hidden: int, tensor_names: list[str], ops: list[Op]) -> int:
    """Append the expert's ops (its tensors renumbered into the main graph); returns its output id."""
    ids = {graph.inputs[0]: hidden}
    for index, name in enumerate(graph.tensor_names):
        if index not in ids:
            ids[index] = _new_tensor(tensor_names, f"{graph.name}:{name}")
    for sub_op in graph.ops:
        if sub_op.type == "Input":
            continue
        name = sub_op.name if sub_op.name.startswith(graph.name) else f"{graph.name}{sub_op.name}"
        ops.append(replace(sub_op, name=name, inputs=[ids[t] for t in sub_op.inputs],
                           outputs=[ids[t] for t in sub_op.outputs]))
    return ids[graph.outputs[0]]


def _new_tensor(tensor_names: list[str], name: str) -> int:
    tensor_names.append(name)
    return len(tensor_names) - 1



# ---- the sparse node: one MoE op's inlined experts folded back, for backends that list SPARSE_MOE ----

def sparse_experts(ops: list[GraphOp], constants: dict[int, np.ndarray]) -> list[GraphOp]:
    """The op list with each MoE op's experts and EXPERT_ADD chain replaced by one SPARSE_MOE node,
    where every expert has the SwiGLU form; other MoE ops stay dense (one warning line each)."""
    chains: dict[str, list[GraphOp]] = {}
    for op in ops:
        if op.node.type == EXPERT_ADD and op.node.param.moe:
            chains.setdefault(op.node.param.moe, []).append(op)
    replace_at: dict[int, GraphOp] = {}
    drop: set[int] = set()
    by_name = {op.node.name: op for op in ops}
    for moe, chain in chains.items():
        expert_ops = [[by_name[name] for name in add.node.param.ops if name in by_name] for add in chain]
        hidden = chain[0].node.param.hidden
        try:
            experts = [_swiglu(expert, hidden, add.inputs[0], constants) for expert, add in zip(expert_ops, chain)]
        except _NotSwiGLU as why:
            warn_once(f"MoE op {moe}: {why}; every expert runs for every token (dense)")
            continue
        param = SparseMoEParam(len(chain), chain[0].node.param.top_k, experts,
                               [node for e in experts for node in (e.gate_up, e.down)])
        weights, selected = chain[0].inputs[1:3]
        replace_at[id(chain[-1])] = GraphOp(Node(SPARSE_MOE, moe, param), [hidden, weights, selected],
                                            list(chain[-1].outputs))
        drop |= {id(op) for op in chain[:-1]} | {id(op) for expert in expert_ops for op in expert}
    return [replace_at.get(id(op), op) for op in ops if id(op) not in drop]


class _NotSwiGLU(Exception):
    """An expert subgraph that is not gate_up -> halves -> silu(gate) * up -> down."""


def _swiglu(ops: list[GraphOp], hidden: int, output: int, constants: dict[int, np.ndarray]) -> SparseExpert:
    """The expert's two Convolutions and its gate half, when its ops have the SwiGLU form."""
    producer = {t: op for op in ops for t in op.outputs}

    def through_views(tensor: int) -> int:
        while tensor in producer and producer[tensor].node.type in VIEW_OPS:
            tensor = producer[tensor].inputs[0]
        return tensor

    def made_by(tensor: int, op_type: str, binary: str | None = None) -> GraphOp:
        op = producer.get(tensor)
        if op is None or op.node.type != op_type or (binary and getattr(op.node.param, "opType", None) != binary):
            raise _NotSwiGLU(f"expected a {binary or op_type} producing {tensor}, got "
                             f"{'an input' if op is None else op.node.type}")
        return op

    down = made_by(through_views(output), "Convolution")
    product = made_by(through_views(down.inputs[0]), "BinaryOp", "MUL")
    silu = next((producer[t] for t in product.inputs if t in producer and producer[t].node.type == "UnaryOp"
                 and getattr(producer[t].node.param, "opType", None) == "SILU"), None)
    if silu is None:
        raise _NotSwiGLU("expected the product of SiLU(gate) and up")
    others = [t for t in product.inputs if t != silu.outputs[0]]
    if len(others) != 1:
        raise _NotSwiGLU("expected the product of SiLU(gate) and up")
    up_slice = made_by(others[0], "StridedSlice")
    gate_slice = made_by(silu.inputs[0], "StridedSlice")
    gate_up = made_by(through_views(gate_slice.inputs[0]), "Convolution")
    if through_views(up_slice.inputs[0]) != gate_up.outputs[0] or through_views(gate_up.inputs[0]) != hidden:
        raise _NotSwiGLU("expected both halves cut from one gate_up Convolution of the expert's input")
    width = int(gate_up.node.param.common.outputCount) // 2
    gate_cols, up_cols = _slice_columns(ops, hidden, (gate_slice, up_slice), gate_up, constants)
    halves = (list(range(width)), list(range(width, 2 * width)))
    if (gate_cols, up_cols) not in (halves, halves[::-1]):
        raise _NotSwiGLU("expected the SiLU and the product to take gate_up's two halves")
    return SparseExpert(gate_up.node, down.node, gate_first=gate_cols == halves[0])


def _slice_columns(ops: list[GraphOp], hidden: int, cuts: tuple[GraphOp, ...], gate_up: GraphOp,
                   constants: dict[int, np.ndarray]) -> list[list[int]]:
    """The gate_up columns each StridedSlice of the expert takes, the same for one and for three
    rows (else not a cut of columns)."""
    taken = []
    for rows in (1, 3):
        tensors = _expert_shapes(ops, hidden, gate_up, rows, constants)
        taken.append([_columns(cut, tensors) for cut in cuts])
    if taken[0] != taken[1]:
        raise _NotSwiGLU("expected slice bounds that do not depend on the row count")
    return taken[0]


def _columns(cut: GraphOp, tensors: dict[int, Tensor]) -> list[int]:
    sliced = tensors[cut.inputs[0]]
    if any(tensors.get(t) is None or tensors[t].host is None for t in cut.inputs[1:]):
        raise _NotSwiGLU("expected slice bounds known from shapes")
    index = np.broadcast_to(np.arange(sliced.shape[-1], dtype=np.int32), sliced.shape)
    try:
        cols = strided_slice(cut.node, [index, *(tensors[t].host for t in cut.inputs[1:])])
    except (IndexError, ValueError, TypeError) as error:
        raise _NotSwiGLU(f"slice bounds do not apply: {error}") from None
    if cols.shape[:-1] != sliced.shape[:-1]:
        raise _NotSwiGLU("expected a slice of gate_up's last axis")
    columns = cols.reshape(-1, cols.shape[-1])
    if not (columns == columns[0]).all():
        raise _NotSwiGLU("expected a slice of gate_up's last axis")
    return columns[0].tolist()


def _expert_shapes(ops: list[GraphOp], hidden: int, gate_up: GraphOp, rows: int,
                   constants: dict[int, np.ndarray]) -> dict[int, Tensor]:
    """Every tensor of the expert that its shape arithmetic reaches with `rows` input rows: shapes,
    and host values where folded (constants, shape ops)."""
    read = {t for op in ops for t in op.inputs if t in constants}
    tensors = {t: Tensor(constants[t].shape, constants[t].dtype, host=constants[t]) for t in read}
    common = gate_up.node.param.common
    tensors[hidden] = Tensor((rows, int(common.inputCount)), np.dtype(np.float32))
    for op in ops:
        inputs = [tensors.get(t) for t in op.inputs]
        if any(t is None for t in inputs):
            continue
        try:
            if op_table.foldable(op.node, inputs):
                values = op_table.evaluate(op.node, [t.host if t.host is not None else shape_stand_in(t)
                                                     for t in inputs])
                made = [Tensor(np.shape(v), np.asarray(v).dtype, host=np.asarray(v)) for v in values]
            else:
                made = [Tensor(tuple(int(d) for d in shape), np.dtype(dtype))
                        for shape, dtype in op_table.infer(op.node, inputs)]
        except (ModelFormatError, IndexError, ValueError, TypeError) as error:
            raise _NotSwiGLU(f"its shapes do not follow for {rows} rows ({error})") from None
        tensors.update(zip(op.outputs, made))
    return tensors
