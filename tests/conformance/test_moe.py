"""The qwen3_moe fixture beyond the shared conformance (test_fixture_models.py runs its greedy
tokens and logits against MNN on every backend): the MoE op is inlined at load; on the CPU,
OpenCL and Vulkan each MoE op becomes one SPARSE_MOE node that runs only the chosen experts (on
the fixed-shape backends with the routing on the device)."""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu.backend import DeviceWarning, Node, Tensor
from mnngpu.backends.cpu import CPUBackend
from mnngpu.backends.cpu.ops.linear import CPULinear
from mnngpu.backends.cpu.ops.routing import CPUSparseMoE
from mnngpu.errors import ModelFormatError
from mnngpu.format import params as P
from mnngpu.format import read_net
from mnngpu.format.weights import WeightFile
from mnngpu.ops import op_table
from mnngpu.ops.op_table import EXPERT_ADD
from mnngpu.ops.routing import SPARSE_MOE, ExpertAddParam
from mnngpu.runtime.graph import GraphOp
from mnngpu.runtime.moe import inline_experts, sparse_experts
from tests.conformance.test_fixture_models import greedy, load
from tests.conftest import FIXTURES, backend_or_skip

MOE = "qwen3_moe_int4_b64"
ROUTING = {"Softmax", "TopKV2", "Reduction", SPARSE_MOE}


def test_inlining_replaces_each_moe_op_by_its_experts():
    net = read_net(FIXTURES / MOE / "llm.mnn")
    moe_ops = [op for op in net.ops if op.type == "MoE"]
    inlined = inline_experts(net)
    assert moe_ops and not any(op.type == "MoE" for op in inlined.ops)
    expert_linears = [op for op in inlined.ops if op.type == "Convolution" and op.name.startswith("/expert/")]
    assert len(expert_linears) == 2 * len(net.subgraphs)   # gate_up and down of every expert
    adds = [op for op in inlined.ops if op.type == EXPERT_ADD]
    assert len(adds) == len(net.subgraphs)
    assert {op.outputs[0] for op in moe_ops} <= {op.outputs[0] for op in adds}


@pytest.mark.parametrize("backend_type", ["opencl", "vulkan"])
def test_routing_never_leaves_the_device(backend_type):
    backend_or_skip(backend_type)
    model = load(MOE, backend_type)
    model.forward([1, 2, 3])
    model.forward([4])
    table = model.placement()
    assert table.fallbacks == []
    placed = {p.op_type: p.backend for p in table.entries.values() if p.op_type in ROUTING}
    assert placed == dict.fromkeys(ROUTING, backend_type)


def _chosen_on_cpu(monkeypatch, prompt: list[int]) -> dict[str, set[int]]:
    """The experts the CPU's router chose for `prompt`, per MoE op."""
    chosen: dict[str, set[int]] = {}
    execute = CPUSparseMoE.onExecute

    def record(self, inputs, outputs):
        chosen.setdefault(self.node.name, set()).update(self.ids.reshape(-1).tolist())
        execute(self, inputs, outputs)

    with monkeypatch.context() as patch:
        patch.setattr(CPUSparseMoE, "onExecute", record)
        load(MOE, "cpu").forward(prompt)
    return chosen


def _stacked_scales(backend_type: str, execution) -> list:
    """(read, write) of the scales of each stacked layer a SPARSE_MOE execution packed, flat float32."""
    if backend_type == "vulkan":
        return [(layer.parts[0].scales.read, layer.parts[0].scales.write) for layer in execution.node.weights["vulkan"]]
    import pyopencl as cl
    queue = execution.backend.queue

    def read(buffer):
        host = np.empty(buffer.size // 4, dtype=np.float32)
        cl.enqueue_copy(queue, host, buffer, is_blocking=True)
        return host

    return [(lambda b=layer.scales: read(b),
             lambda values, b=layer.scales: cl.enqueue_copy(queue, b, np.ascontiguousarray(values), is_blocking=True))
            for layer in execution.node.weights["opencl"]]


def _sparse_executions(backend_type: str, monkeypatch) -> dict[str, list]:
    """SPARSE_MOE executions the device backend resizes from now on, by node name, each with the
    work it records: [(kernel, entries)], entries the grid's second dimension."""
    if backend_type == "vulkan":
        from mnngpu.backends.vulkan.ops.routing import VulkanSparseMoE as Execution
    else:
        from mnngpu.backends.opencl.ops.routing import OpenCLSparseMoE as Execution
    made: dict[str, list] = {}
    resize = Execution.onResize

    def record(self, inputs, outputs):
        resize(self, inputs, outputs)
        if backend_type == "vulkan":
            work = [(d.kernel.name, d.groups[1]) for d in self.segment.dispatches[-2:]]
        else:
            work = [(launch.kernel.function_name, launch.global_size[1]) for launch in self.launches]
        made.setdefault(self.node.name, []).append((self, inputs[0].shape[0], work))

    monkeypatch.setattr(Execution, "onResize", record)
    return made


@pytest.mark.parametrize("backend_type", ["opencl", "vulkan"])
def test_device_runs_only_the_experts_the_router_chose(backend_type, monkeypatch):
    """Every expert the router did not choose for a one-token forward gets NaN scales in the
    device's stacked weights: the logits stay what they were, finite. Were every expert run (the
    dense chain, or a kernel reading each expert's rows times a zero weight), NaN would reach them.
    The recorded work per MoE op is two expert kernels, over rows * top_k entries, then rows."""
    prompt, num_experts, top_k = [7], 4, 2
    chosen = _chosen_on_cpu(monkeypatch, prompt)
    backend_or_skip(backend_type)
    executions = _sparse_executions(backend_type, monkeypatch)
    model = load(MOE, backend_type)
    clean = np.asarray(model.forward(prompt)).copy()
    assert sorted(executions) == sorted(chosen) and all(len(ids) == top_k for ids in chosen.values())
    for name, resized in executions.items():
        for execution, rows, work in resized:
            assert [entries for _, entries in work] == [rows * top_k, rows], work
        execution = resized[0][0]
        for read, write in _stacked_scales(backend_type, execution):
            values = read().reshape(num_experts, -1)
            values[[e for e in range(num_experts) if e not in chosen[name]]] = np.nan
            write(values.reshape(-1))
    model.reset()
    poisoned = np.asarray(model.forward(prompt))
    assert np.isfinite(poisoned).all()
    np.testing.assert_array_equal(poisoned, clean)


def test_expert_add_rejects_routing_that_does_not_fit_the_rows():
    node = Node(EXPERT_ADD, "/blocks.0/mlp/custom_moe/MoE_output_0/expert0", ExpertAddParam(0, top_k=2))
    fits = [Tensor((5, 40), np.float32), Tensor((1, 5, 2), np.float32), Tensor((1, 5, 2), np.int32)]
    assert op_table.infer(node, fits) == [((5, 40), np.float32)]
    for bad in ([Tensor((1, 5, 40), np.float32), *fits[1:]],                            # 3-D expert output
                [fits[0], Tensor((1, 5, 3), np.float32), Tensor((1, 5, 3), np.int32)]):  # 3 entries per row
        with pytest.raises(ModelFormatError, match="top_k=2") as error:
            op_table.infer(node, bad)
        assert error.value.field == node.name


@pytest.mark.parametrize("attrs, problem", [({"num_experts": 4}, "missing \\['top_k'\\]"),
                                            ({"num_experts": 4, "top_k": 5}, "0 < top_k <= num_experts")])
def test_moe_attributes_are_checked(attrs, problem):
    net = read_net(FIXTURES / MOE / "llm.mnn")
    position, moe = next((i, op) for i, op in enumerate(net.ops) if op.type == "MoE")
    moe.param = P.Extra(attr=[P.Attribute(key=key, i=value) for key, value in attrs.items()])
    with pytest.raises(ModelFormatError, match=problem) as error:
        inline_experts(net)
    assert error.value.path == str(FIXTURES / MOE / "llm.mnn")
    assert error.value.field == f"oplists[{position}] ({moe.name}).main.attr"


def test_cpu_runs_only_the_experts_the_router_chose(monkeypatch):
    """Every expert linear the CPU runs, with its row count, against the expert ids each MoE op was
    given: each chosen expert runs once over exactly the rows that chose it, no other expert runs,
    so a layer reads top_k experts' rows per token (num_experts per token if every expert ran)."""
    runs: list[tuple[np.ndarray, list[tuple[str, int]]]] = []
    moe_execute, linear_execute = CPUSparseMoE.onExecute, CPULinear.onExecute

    def moe(self, inputs, outputs):
        runs.append((self.ids.copy(), []))
        moe_execute(self, inputs, outputs)

    def linear(self, inputs, outputs):
        if self.node.name.startswith("/expert/"):
            runs[-1][1].append((self.node.name, self.rows))
        linear_execute(self, inputs, outputs)

    monkeypatch.setattr(CPUSparseMoE, "onExecute", moe)
    monkeypatch.setattr(CPULinear, "onExecute", linear)
    model = load(MOE, "cpu")
    model.forward(list(range(1, 14)))   # a prefill of 13 rows: grouped by expert
    model.forward([5])                  # decode: one row
    net = read_net(FIXTURES / MOE / "llm.mnn")
    num_experts, top_k = 4, 2
    moe_ops = sum(op.type == "MoE" for op in net.ops)
    assert len(runs) == 2 * moe_ops
    for ids, linears in runs:
        layer = _layer_of(linears[0][0])
        chosen = {f"/expert/{layer}_{e}": int(n) for e, n in zip(*np.unique(ids, return_counts=True))}
        gate_up = {name.split("/gate_up")[0]: rows for name, rows in linears if "/gate_up" in name}
        down = {name.split("/down")[0]: rows for name, rows in linears if "/down" in name}
        assert gate_up == chosen and down == chosen
        assert sum(gate_up.values()) == ids.shape[0] * top_k < ids.shape[0] * num_experts
        assert len(linears) == 2 * len(chosen)


def _layer_of(name: str) -> int:
    return int(name.split("/")[2].split("_")[0])


def _graph_ops(net, weights: WeightFile) -> tuple[list[GraphOp], dict[int, np.ndarray]]:
    constants = {op.outputs[0]: op.param.array(weights) for op in net.ops if op.type == "Const"}
    ops = [GraphOp(Node(op.type, op.name, op.param), list(op.inputs), list(op.outputs))
           for op in net.ops if op.type not in ("Input", "Const")]
    return ops, constants


def test_each_moe_op_becomes_one_sparse_node_with_the_gate_half_first():
    net = inline_experts(read_net(FIXTURES / MOE / "llm.mnn"))
    ops, constants = _graph_ops(net, WeightFile(FIXTURES / MOE / "llm.mnn.weight"))
    sparse = sparse_experts(ops, constants)
    nodes = [op for op in sparse if op.node.type == SPARSE_MOE]
    assert len(nodes) == 2 and not any(op.node.type == EXPERT_ADD for op in sparse)
    assert not any(op.node.name.startswith("/expert/") for op in sparse)
    for op in nodes:
        param = op.node.param
        assert (param.num_experts, param.top_k, len(param.members)) == (4, 2, 8)
        # the exporter's gate_up.chunk(2): the gate is the first half
        assert all(expert.gate_first for expert in param.experts)


def test_an_expert_of_another_form_keeps_its_moe_op_dense_and_says_so():
    net = inline_experts(read_net(FIXTURES / MOE / "llm.mnn"))
    ops, constants = _graph_ops(net, WeightFile(FIXTURES / MOE / "llm.mnn.weight"))
    silu = next(op for op in ops if op.node.name.startswith("/expert/1_2") and op.node.type == "UnaryOp")
    silu.node.param = P.UnaryOp(opType="SIGMOID")
    with pytest.warns(DeviceWarning, match="MoE op /blocks.1/mlp/custom_moe/MoE_output_0: .*SiLU.*dense"):
        sparse = sparse_experts(ops, constants)
    kinds = [op.node.type for op in sparse]
    assert kinds.count(SPARSE_MOE) == 1 and kinds.count(EXPERT_ADD) == 4


def test_sparse_experts_agree_with_the_dense_chain_at_precision_low(monkeypatch):
    """Precision low packs the experts into lane groups, which the sparse node cuts into gate and
    up views: its greedy tokens and logits against the dense chain's on the same packing."""
    prompt = list(range(1, 10))
    sparse = greedy(load(MOE, "cpu", precision="low"), prompt, 4)
    monkeypatch.setattr(CPUBackend, "executions", {k: v for k, v in CPUBackend.executions.items() if k != SPARSE_MOE})
    dense_model = load(MOE, "cpu", precision="low")
    dense = greedy(dense_model, prompt, 4)
    assert not any(p.op_type == SPARSE_MOE for p in dense_model.placement().entries.values())
    assert sparse[0] == dense[0]
    assert np.abs(sparse[1] - dense[1]).max() < 1e-2 * dense[1].std()
