"""The qwen3_moe fixture beyond the shared conformance (test_fixture_models.py runs its greedy
tokens and logits against MNN on every backend): the MoE op is inlined at load, and on the
fixed-shape backends the routing stays on the device."""

from __future__ import annotations

import pytest

from mnngpu.format import read_net
from mnngpu.runtime.moe import inline_experts
from mnngpu.runtime.op_table import EXPERT_ADD
from tests.conformance.test_fixture_models import load
from tests.conftest import FIXTURES, backend_or_skip

MOE = "qwen3_moe_int4_b64"
ROUTING = {"Softmax", "TopKV2", "Reduction", EXPERT_ADD}


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
