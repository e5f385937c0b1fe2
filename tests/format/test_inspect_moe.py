"""`mnngpu inspect` on a MoE export: the experts run per token and the bytes a decode step reads
where only those run, against the expert layers' sizes computed here from their shapes."""

from __future__ import annotations

from mnngpu.apps.inspect import format_inspect_table, inspect_model
from mnngpu.format import read_net
from tests.conftest import FIXTURES

MOE = FIXTURES / "qwen3_moe_int4_b64"


def _int4_layer_bytes(oc: int, ic: int, block: int = 64) -> int:
    """int4 codes and fp32 (min, scale) pairs per block of 64, as the exporter writes them."""
    return oc * ic // 2 + oc * (ic // block) * 8


def test_inspect_counts_the_chosen_experts_bytes():
    info = inspect_model(MOE)
    moe = info["moe"]
    net = read_net(MOE / "llm.mnn")
    layers = sum(op.type == "MoE" for op in net.ops)
    hidden, width = 128, 64   # the fixture's hidden size and expert width (tools/make_fixtures.py)
    expert = _int4_layer_bytes(2 * width, hidden) + _int4_layer_bytes(hidden, width)
    assert (moe["layers"], moe["num_experts"], moe["top_k"]) == (layers, 4, 2)
    total = layers * 4 * expert
    assert abs(moe["expert_bytes"] - total) < 0.01 * total   # the file adds a few header bytes per layer
    skipped = moe["expert_bytes"] * (4 - 2) // 4
    assert moe["bytes_per_token"] == info["weight_bytes"] - skipped
    assert "2 of 4 run per token in 2 MoE layers" in format_inspect_table(info)


def test_a_dense_model_has_no_expert_facts():
    assert inspect_model(FIXTURES / "qwen3_int4_b64")["moe"] is None
