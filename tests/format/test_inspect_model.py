"""inspect_model against the facts the fixtures were made from: the HF config, the exporter's
arguments and mnnconvert's op counts recorded in reference.json."""

from __future__ import annotations

import json

import pytest

from mnngpu.apps.inspect import format_inspect_table, inspect_model
from mnngpu.format import read_net
from tests.format.format_truth import (
    FIXTURE_NAMES,
    expert_count,
    fixture_dir,
    fixture_family,
    hf_config,
    linears_in_layers,
    needs_fixtures,
    reference,
    split_projections,
)

# HF's layer_types of a hybrid model: the layers that keep a recurrent state instead of a KV cache,
# and the LinearAttention mode the exporter writes for each
RECURRENT_LAYER_TYPES = {"conv": "short_conv", "linear_attention": "gated_delta_rule"}


def hf_layer_kinds(hf: dict) -> list[str]:
    """What inspect should name each layer: its LinearAttention mode, else attention (full or sliding)."""
    types = hf.get("layer_types") or ["full_attention"] * hf["num_hidden_layers"]
    return [RECURRENT_LAYER_TYPES.get(kind, "attention") for kind in types]


def export_arg(args: list[str], flag: str, default):
    return type(default)(args[args.index(flag) + 1]) if flag in args else default


@needs_fixtures
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_inspect_reports_the_source_model(name):
    folder, hf, ref = fixture_dir(name), hf_config(name), reference(name)
    info = inspect_model(folder)
    json.dumps(info)  # plain data, ready for --json

    assert info["ops"] == ref["op_counts"] and info["n_ops"] == sum(ref["op_counts"].values())
    # a MoE export holds one subgraph per expert of each layer
    assert info["n_subgraphs"] == expert_count(hf) * hf["num_hidden_layers"]
    heads = hf["num_attention_heads"]
    assert info["model"] == {
        "type": fixture_family(name), "hidden_size": hf["hidden_size"], "layers": hf["num_hidden_layers"],
        "linear_layers": sum(kind in RECURRENT_LAYER_TYPES for kind in hf.get("layer_types") or []),
        "layer_kinds": hf_layer_kinds(hf),
        "heads": heads, "kv_heads": hf["num_key_value_heads"],
        "head_dim": hf.get("head_dim") or hf["hidden_size"] // heads, "vocab": hf["vocab_size"],
        "embeddings": info["model"]["embeddings"],
    }
    tied = hf.get("tie_word_embeddings", False)
    assert info["model"]["embeddings"].startswith("tied" if tied else "embeddings_")

    args = ref["export_args"]
    bits, block = export_arg(args, "--quant_bit", 4), export_arg(args, "--quant_block", 64)
    widest_input = max(layer["ic"] for layer in info["quant"]["layers"])
    if widest_input <= block:   # one block spans every row: channel-wise, which inspect calls block 0
        block = 0
    want = {"bits": bits, "block": block, "symmetric": "--sym" in args, "mixed": False}
    if bits > 8:  # float weights: no blocks, no zero points
        want = {"bits": bits, "mixed": False}
    summary = info["quant"]["summary"]
    split = split_projections(read_net(folder / "llm.mnn"))
    assert {k: summary[k] for k in want} == want and summary["count"] == linears_in_layers(hf) + split
    lm_head = info["quant"]["lm_head"]
    assert lm_head["bits"] == export_arg(args, "--lm_quant_bit", bits)
    assert len(info["quant"]["layers"]) == linears_in_layers(hf) + split + 1

    assert info["files"] == {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}
    assert info["weight_bytes"] == (folder / "llm.mnn.weight").stat().st_size


@needs_fixtures
def test_config_path_works_like_the_folder_and_the_table_shows_the_facts():
    folder = fixture_dir(FIXTURE_NAMES[0])
    info = inspect_model(folder / "config.json")
    assert info == inspect_model(folder)
    text = format_inspect_table(info)
    model = info["model"]
    for fact in (f"hidden {model['hidden_size']}", f"vocab {model['vocab']}", "llm.mnn.weight",
                 f"{info['n_ops']} ops", "Convolution"):
        assert fact in text


@needs_fixtures
@pytest.mark.parametrize(("name", "layers", "named"), [
    ("qwen3_5_int4_b64", ["linear_attention"] * 3 + ["full_attention"], "4 layers (0-2 Gated DeltaNet; 3 attention)"),
    ("lfm2_int4_b64", ["conv", "full_attention", "conv"], "3 layers (0, 2 short convolution; 1 attention)"),
])
def test_the_table_names_the_linear_and_the_attention_layers(name, layers, named):
    assert hf_config(name)["layer_types"] == layers   # what the fixture was made with (tools/make_fixtures.py)
    assert named in format_inspect_table(inspect_model(fixture_dir(name)))
