"""The qwen3_moe fixture beyond the shared conformance (test_fixture_models.py runs its greedy
tokens and logits against MNN on every backend): the MoE op is inlined at load, and on the
fixed-shape backends the routing stays on the device."""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu.backend import Node, Tensor
from mnngpu.errors import ModelFormatError
from mnngpu.format import params as P
from mnngpu.format import read_net
from mnngpu.runtime import op_table
from mnngpu.runtime.moe import ExpertAddParam, inline_experts
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
