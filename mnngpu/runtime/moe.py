"""MNN's MoE op: the router's choice applied to per-expert subgraphs, inlined into one graph.

An export's MoE op (an `Extra` table with num_experts, top_k, layer_id) reads
[hidden (seq, H), routing weights (.., seq, top_k), selected experts (.., seq, top_k) int32]
and names one subgraph per expert, "/expert/{layer_id}_{i}" in Net.subgraphs, each taking the
hidden rows and returning (seq, H). MNN's runtime reads the selected ids on the host and runs
only those experts. Here the experts' ops are inlined into the main graph instead, and the MoE
op becomes a chain of EXPERT_ADD nodes: acc += w_e * expert_e(hidden), where w_e is the
routing weight of expert e for each token (zero where the router did not select e). Every
shape is fixed, so a device backend replays the same commands every token with the routing
staying on the device; the price is that every expert runs on every token (num_experts/top_k
times the expert work of a sparse run).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mnngpu.errors import ModelFormatError
from mnngpu.format import Net
from mnngpu.format.net import Op, SubGraph
from mnngpu.runtime.op_table import EXPERT_ADD


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
        name = f"/expert/{param.layer_id}_{expert}"
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
            output = _inline_expert(graph, hidden, tensor_names, ops)
            last = expert == len(experts) - 1
            target = op.outputs[0] if last else _new_tensor(tensor_names, f"{op.name}/sum{expert}")
            inputs = [output, weights, selected] + ([] if acc is None else [acc])
            ops.append(Op(EXPERT_ADD, f"{op.name}/expert{expert}", inputs, [target], "ExpertAddParam",
                          ExpertAddParam(expert, top_k)))
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

