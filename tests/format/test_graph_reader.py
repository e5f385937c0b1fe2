"""read_net against mnnconvert's JSON dump of the same file, op by op and field by field."""

from __future__ import annotations

import json
from collections import Counter

import flatbuffers
import numpy as np
import pytest

from mnngpu.format import Net, UnknownParam, parse_net, read_net
from mnngpu.format.params import Blob
from tests.format import fb_writer as fbw
from tests.format.format_truth import (
    CONVERTER_TRUTH,
    FIXTURE_NAMES,
    fixture_dir,
    json_to_mnn,
    llm_config,
    mismatches,
    mnn_to_json,
    needs_fixtures,
    reference,
)


def assert_net_matches_json(net: Net, dump: dict) -> None:
    problems = []
    if len(net.ops) != len(dump["oplists"]):
        problems.append(f"{len(net.ops)} ops, JSON has {len(dump['oplists'])}")
    for i, (op, expected) in enumerate(zip(net.ops, dump["oplists"])):
        where = f"oplists[{i}] {op.name}"
        decoded = {"type": op.type, "name": op.name, "inputIndexes": op.inputs, "outputIndexes": op.outputs,
                   "main_type": op.param_type, "defaultDimentionFormat": op.default_format,
                   "externalPath": op.external_path}
        wanted = {"type": expected["type"], "name": expected.get("name", ""),
                  "inputIndexes": expected.get("inputIndexes", []),
                  "outputIndexes": expected.get("outputIndexes", []),
                  "main_type": expected.get("main_type", "NONE"),
                  "defaultDimentionFormat": expected.get("defaultDimentionFormat", "NHWC"),
                  "externalPath": expected.get("externalPath")}
        problems += [f"{where}.{k}: decoded {decoded[k]!r}, JSON has {wanted[k]!r}"
                     for k in decoded if decoded[k] != wanted[k]]
        if isinstance(op.param, UnknownParam):
            continue  # kept opaque on purpose; its union member name was compared above
        if "main" in expected:
            problems += mismatches(op.param, expected["main"], f"{where}.main")
        elif op.param is not None:
            problems.append(f"{where}: decoded a parameter the JSON does not have")
    if net.tensor_names != dump.get("tensorName", []):
        problems.append("tensorName differs")
    if net.output_names != dump.get("outputName", []):
        problems.append("outputName differs")
    if net.version != dump.get("extraInfo", {}).get("version", ""):
        problems.append(f"version {net.version!r}")
    if len(net.subgraphs) != len(dump.get("subgraphs", [])):
        problems.append("subgraph count differs")
    assert not problems, "\n".join(problems[:30])


@needs_fixtures
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_op_matches_mnnconvert_json(name, tmp_path):
    """Against MNN 3.6.1's converter; a newer-format fixture, which that converter cannot dump, against
    the dump of the converter that wrote it, committed beside it (tools/make_fixtures.py)."""
    path = fixture_dir(name) / "llm.mnn"
    committed = fixture_dir(name) / CONVERTER_TRUTH
    dump = json.loads(committed.read_text()) if committed.is_file() else mnn_to_json(path, tmp_path)
    assert_net_matches_json(read_net(path), dump)


@needs_fixtures
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_op_counts_match_the_recorded_reference(name):
    net = read_net(fixture_dir(name) / "llm.mnn")
    assert dict(Counter(op.type for op in net.ops)) == reference(name)["op_counts"]


@needs_fixtures
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_graph_facts_the_engine_relies_on(name):
    net = read_net(fixture_dir(name) / "llm.mnn")
    inputs = {op.name: op.param for op in net.ops if op.type == "Input"}
    # Gemma 4's graph also takes its per-layer embedding rows, whose file llm_config.json names
    ple = {"ple_embeddings"} if "ple_embed_file" in llm_config(name) else set()
    assert set(inputs) == {"input_ids", "attention_mask", "position_ids", "logits_index"} | ple
    assert inputs["position_ids"].dtype == "DT_INT32" and inputs["input_ids"].dtype == "DT_FLOAT"
    assert net.output_names == ["logits", "hidden_states"]
    for op in net.ops:
        if op.type == "Const":
            value = op.param.array()
            assert value.shape == op.param.shape
            stored = {"DT_INT32": op.param.int32s, "DT_FLOAT": op.param.float32s}[op.param.dataType]
            np.testing.assert_array_equal(value.reshape(-1), stored)
        if op.type == "Attention":
            assert op.param_type == "AttentionParam" and op.param.kv_cache and len(op.inputs) == 4


# A graph the exporter does not write, through the real converter: parameter tables the
# LLM exports leave out (RoPE, Extra attributes, DT_HALF constants, ...) and one this
# reader keeps opaque (Pool).
CRAFTED = {
    "tensorName": ["x", "y", "z", "w"], "outputName": ["z"], "extraInfo": {"version": "9.9.9"},
    "oplists": [
        {"name": "x", "type": "Input", "main_type": "Input", "outputIndexes": [0],
         "main": {"dims": [1, 4], "dtype": "DT_FLOAT", "dformat": "NCHW"}},
        {"name": "rope", "type": "RoPE", "main_type": "RoPEParam", "inputIndexes": [0], "outputIndexes": [1],
         "main": {"rope_cut_head_dim": 2, "num_head": 4, "kv_num_head": 2, "head_dim": 8,
                  "q_norm": {"axis": [-1], "epsilon": 1e-6, "gamma": [1.0, 2.0], "useRMSNorm": True}}},
        {"name": "ex", "type": "Extra", "main_type": "Extra", "inputIndexes": [1], "outputIndexes": [2],
         "main": {"type": "MoE", "engine": "MNN", "attr": [
             {"key": "num_experts", "i": 8}, {"key": "name", "s": "moe0"},
             {"key": "lst", "list": {"i": [1, 2], "f": [0.5], "s": ["a"]}},
             {"key": "t", "tensor": {"dims": [2], "dataType": "DT_INT32", "int32s": [7, 8]}}]}},
        {"name": "pool", "type": "Pooling", "main_type": "Pool", "inputIndexes": [2], "outputIndexes": [3],
         "main": {"kernelX": 2, "kernelY": 2, "type": "AVEPOOL", "pads": [0, 1], "countType": "INCLUDE_PADDING"}},
        {"name": "pool3d", "type": "Pooling3D", "main_type": "Pool3D", "inputIndexes": [2], "outputIndexes": [3],
         "main": {"kernels": [2, 2, 2]}},
        {"name": "half", "type": "Const", "main_type": "Blob", "outputIndexes": [3],
         "main": {"dims": [2], "dataType": "DT_HALF", "uint8s": [0, 60, 0, 192]}},
        {"name": "sh", "type": "Shape", "main_type": "ShapeParam", "inputIndexes": [0], "outputIndexes": [3],
         "main": {"hasStart": True, "start": 1}},
        {"name": "att", "type": "Attention", "main_type": "AttentionParam", "inputIndexes": [0, 0, 0],
         "outputIndexes": [3], "main": {"kv_cache": False, "layer_index": 3, "attnScale": 0.125,
                                        "kv_shared_layer": "l0"}},
        {"name": "mul", "type": "BinaryOp", "main_type": "BinaryOp", "inputIndexes": [0, 1], "outputIndexes": [3],
         "main": {"opType": "MUL_SILU", "T": "DT_FLOAT"}},
        {"name": "sq", "type": "Squeeze", "main_type": "SqueezeParam", "inputIndexes": [0], "outputIndexes": [3],
         "main": {"squeezeDims": [0, -1]}},
    ],
}


def test_tables_beyond_the_llm_exports_match_their_json(tmp_path):
    mnn_path = json_to_mnn(CRAFTED, tmp_path, "crafted")
    net = read_net(mnn_path)
    assert_net_matches_json(net, mnn_to_json(mnn_path, tmp_path))
    by_name = {op.name: op for op in net.ops}
    pool = by_name["pool"].param
    assert (pool.kernelX, pool.type, pool.pads, pool.countType, pool.ceilModel) == \
        (2, "AVEPOOL", [0, 1], "INCLUDE_PADDING", True)   # ceilModel: the schema's default
    assert by_name["pool3d"].param == UnknownParam("Pool3D")
    assert by_name["pool3d"].param_type == "Pool3D"
    np.testing.assert_array_equal(by_name["half"].param.array(), np.array([1.0, -2.0], dtype=np.float32))
    attrs = {a.key: a for a in by_name["ex"].param.attr}
    assert attrs["num_experts"].i == 8 and attrs["name"].s == "moe0"
    assert attrs["lst"].list.i == [1, 2] and attrs["t"].tensor.array().tolist() == [7, 8]
    assert by_name["rope"].param.q_norm.gamma.tolist() == [1.0, 2.0]
    assert by_name["mul"].param.opType == "MUL_SILU"
    assert net.version == "9.9.9"


def test_blob_array_dtypes_and_shapes():
    assert Blob(dims=[2, 2], dataType="DT_INT32", int32s=np.arange(4, dtype="<i4")).array().shape == (2, 2)
    assert Blob(dims=None, dataType="DT_FLOAT", float32s=np.ones(1, "<f4")).array().shape == ()
    assert Blob(dims=[3], dataType="DT_INT8", int8s=np.array([-1, 0, 1], "i1")).array().dtype == np.int8
    bf16 = Blob(dims=[1], dataType="DT_BFLOAT16", uint8s=np.array([0x80, 0x3F], "u1"))  # 0x3F80 = 1.0
    assert bf16.array().tolist() == [1.0]


def _fused_graph(param_code: int = fbw.OP_PARAMETER["FusedLinearParam"], op_code: int = fbw.OP_TYPE["FusedLinear"]):
    b = flatbuffers.Builder(0)
    gate = fbw.conv2d(b, 3, 2, weight=[1, 2, 3, 4, 5, 6])
    up = fbw.conv2d(b, 3, 2, external=[10, 24, 0, 12, 0])
    ln = fbw.layernorm(b, [1.0, 0.5], 1e-5, rms=True)
    fused = fbw.fused_linear(b, [gate, up], act_silu_mul=True, ln=ln)
    gated_ln = fbw.layernorm(b, [2.0, 3.0], 1e-6, rms=True, external=[0, 8, 0])
    ops = [fbw.op(b, "fl", op_code, param_code, fused, [0], [1]),
           fbw.op(b, "gated", fbw.OP_TYPE["GatedRMSNorm"], fbw.OP_PARAMETER["LayerNorm"], gated_ln, [0, 1], [2])]
    inner = fbw.op(b, "expert0", fbw.OP_TYPE["Convolution"], fbw.OP_PARAMETER["Convolution2D"],
                   fbw.conv2d(b, 2, 2, weight=[1, 0, 0, 1]), [0], [1])
    sub = fbw.subgraph(b, "/expert/0", ["in", "out"], [inner], inputs=[0], outputs=[1])
    return fbw.net(b, ops, ["x", "y", "z"], ["z"], subgraphs=[sub])


def test_fused_export_tables_and_subgraphs():
    net = parse_net(_fused_graph())
    fused, gated = net.ops
    assert (fused.type, fused.param_type) == ("FusedLinear", "FusedLinearParam")
    assert fused.param.act_silu_mul and fused.param.has_ln and not fused.param.ln_fold
    assert [c.common.outputCount for c in fused.param.convs] == [3, 3]
    assert fused.param.convs[0].weight.tolist() == [1, 2, 3, 4, 5, 6]
    assert fused.param.convs[1].external == [10, 24, 0, 12, 0]
    assert fused.param.ln.gamma.tolist() == [1.0, 0.5] and fused.param.ln.useRMSNorm
    assert (gated.type, gated.param_type, gated.inputs) == ("GatedRMSNorm", "LayerNorm", [0, 1])
    assert gated.param.external == [0, 8, 0]
    (sub,) = net.subgraphs
    assert (sub.name, sub.tensor_names, sub.inputs, sub.outputs) == ("/expert/0", ["in", "out"], [0], [1])
    assert sub.ops[0].name == "expert0" and sub.ops[0].param.weight.tolist() == [1, 0, 0, 1]


def test_unknown_union_member_and_op_type_do_not_crash():
    net = parse_net(_fused_graph(param_code=200, op_code=4242))
    assert net.ops[0].param == UnknownParam("UNKNOWN(200)")
    assert net.ops[0].param_type == "UNKNOWN(200)" and net.ops[0].type == "UNKNOWN(4242)"


def test_blob_stored_in_the_weight_file(tmp_path):
    from mnngpu.errors import ModelFormatError
    from mnngpu.format import WeightFile

    path = tmp_path / "llm.mnn.weight"
    path.write_bytes(b"pad!" + np.array([1.5, -2.0], "<f4").tobytes())
    blob = Blob(dims=[2, 1], dataType="DT_FLOAT", external=[4, 8])
    assert blob.array(WeightFile(path)).tolist() == [[1.5], [-2.0]]
    with pytest.raises(ModelFormatError, match="WeightFile"):
        blob.array()
