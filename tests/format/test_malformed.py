"""Damaged files raise ModelFormatError / WeightFileError naming the file, never anything else."""

from __future__ import annotations

import dataclasses

import flatbuffers
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mnngpu.errors import ModelFormatError, WeightFileError
from mnngpu.format import parse_net, read_net
from mnngpu.format.enums import OP_TYPE
from mnngpu.format.quant import read_linear
from mnngpu.format.weights import WeightFile
from mnngpu.ops.norm import read_layernorm
from mnngpu.runtime.validate import check_graph
from tests.format import fb_writer as fbw
from tests.format.format_truth import FIXTURE_NAMES, fixture_dir, needs_fixtures

FIXTURE = FIXTURE_NAMES[0] if FIXTURE_NAMES else None


def graph_bytes() -> bytes:
    return (fixture_dir(FIXTURE) / "llm.mnn").read_bytes()


def decode_everything(data: bytes) -> None:
    net = parse_net(data, "damaged.mnn")
    for op in net.ops:
        if op.param_type == "Blob" and op.param is not None:
            op.param.array()


@needs_fixtures
def test_every_truncation_is_a_format_error():
    data = graph_bytes()
    for length in list(range(64)) + list(range(64, len(data), 97)):
        with pytest.raises(ModelFormatError) as err:
            parse_net(data[:length], "cut.mnn")
        assert "cut.mnn" in str(err.value)


@needs_fixtures
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_flipped_bytes_decode_or_raise_a_format_error(data):
    buffer = bytearray(graph_bytes())
    for _ in range(data.draw(st.integers(1, 6))):
        buffer[data.draw(st.integers(0, len(buffer) - 1))] = data.draw(st.integers(0, 255))
    try:
        decode_everything(bytes(buffer))
    except ModelFormatError:
        pass


def test_errors_name_the_file_and_field(tmp_path):
    with pytest.raises(ModelFormatError, match="missing.mnn"):
        read_net(tmp_path / "missing.mnn")
    with pytest.raises(ModelFormatError, match=r"tiny.mnn: Net: not an MNN model file \(expected 4 bytes"):
        parse_net(b"\x01\x00", "tiny.mnn")
    with pytest.raises(WeightFileError, match="missing.weight"):
        WeightFile(tmp_path / "missing.weight")


def test_a_tensor_index_out_of_range_is_named():
    b = flatbuffers.Builder(0)
    conv = fbw.conv2d(b, 1, 1, weight=[1.0])
    ops = [fbw.op(b, "ok", fbw.OP_TYPE["Convolution"], fbw.OP_PARAMETER["Convolution2D"], conv, [0], [1]),
           fbw.op(b, "bad", fbw.OP_TYPE["Convolution"], fbw.OP_PARAMETER["Convolution2D"], conv, [1], [3])]
    data = fbw.net(b, ops, ["x", "y", "z"], ["z"])
    with pytest.raises(ModelFormatError, match=r"bad_index.mnn: Net\.oplists\[1\]\.outputIndexes\[0\]: .*\[0, 3\)"):
        parse_net(data, "bad_index.mnn")


@needs_fixtures
def test_short_or_damaged_weight_files(tmp_path):
    folder = fixture_dir(FIXTURE)
    net = read_net(folder / "llm.mnn")
    weights = (folder / "llm.mnn.weight").read_bytes()
    layers = [op for op in net.ops if op.type in ("Convolution", "LayerNorm")]
    short = tmp_path / "short.weight"
    short.write_bytes(weights[: len(weights) // 2])
    failures = 0
    for op in layers:
        try:
            read(WeightFile(short), op)
        except WeightFileError as err:
            failures += 1
            assert "short.weight" in str(err) and "offset" in str(err)
    assert failures >= len(layers) // 3
    rng = np.random.default_rng(0)
    for op in layers:
        for _ in range(5):
            external = list(op.param.external)
            external[int(rng.integers(len(external)))] = int(rng.choice([-1, 2**40, len(weights) + 1]))
            with pytest.raises((WeightFileError, ModelFormatError)):
                read(WeightFile(folder / "llm.mnn.weight"), dataclasses.replace(op, param=dataclasses.replace(
                    op.param, external=external)))


def read(weights: WeightFile, op):
    if op.type == "Convolution":
        return read_linear(weights, op.param, op.name).dequantize()
    return read_layernorm(weights, op.param, op.name)


def test_shared_tables_cannot_blow_up_decoding():
    # An Attribute whose NamedAttrList holds the same Attribute twice, nested deep: a DAG
    # with 2^depth paths. The reader must stop, not walk them all.
    b = flatbuffers.Builder(0)
    attribute = fbw._table(b, 9, [("int32", 1, 1)])
    for _ in range(25):  # 50 levels deep (under the depth limit), 2^25 paths
        attrs = fbw._offsets(b, [attribute, attribute])
        named = fbw._table(b, 2, [("offset", 1, attrs)])
        attribute = fbw._table(b, 9, [("offset", 8, named)])
    extra = fbw._table(b, 5, [("offset", 3, fbw._offsets(b, [attribute]))])
    ops = [fbw.op(b, "ex", 512, 78, extra, [], [0])]  # OpType Extra = 512, OpParameter Extra = 78
    with pytest.raises(ModelFormatError, match="table visits"):
        parse_net(fbw.net(b, ops, ["x"], ["x"]), "dag.mnn")


def test_a_strided_slice_without_its_parameter_table_is_named_by_validate():
    """Found by the flow fuzz (case 1864): the host rule reads the table, so validate insists on it
    instead of letting an AttributeError escape from the first resize."""
    b = flatbuffers.Builder(0)
    strided = next(code for code, name in OP_TYPE.items() if name == "StridedSlice")
    cut = fbw.op(b, "cut", strided, 0, None, [0, 1, 2, 3], [4])
    net = parse_net(fbw.net(b, [cut], ["x", "begin", "end", "strides", "y"], ["y"]))
    with pytest.raises(ModelFormatError, match=r"\(cut\): expected a StridedSliceParam parameter table"):
        check_graph(net)
