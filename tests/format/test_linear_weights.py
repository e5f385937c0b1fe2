"""Decoded weights against the HuggingFace tensors they were exported from.

`mnn_weight` below is a second decoder written from the byte layout (MNN_FORMAT.md /
docs/formats.md) and MNN's formula w = table_value * scale + min, independent of
mnngpu.format.quant; the HF tensors are the truth both must approximate to within half a
quantization step.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mnngpu.config.keys import TIE_FIELDS
from mnngpu.format import read_net
from mnngpu.format.quant import read_linear
from mnngpu.format.rows import QuantizedRows, read_quantized_rows
from mnngpu.format.weights import WeightFile
from mnngpu.ops.norm import read_layernorm
from tests.format.format_truth import (
    FIXTURE_NAMES,
    NORMS_AS_PLAIN_OPS,
    family,
    fixture_dir,
    hf_config,
    hf_linear_name,
    hf_linear_truth,
    hf_norm_name,
    hf_tensors,
    linear_layers,
    linears_in_layers,
    needs_fixtures,
    split_projections,
)


def mnn_weight(blob: bytes, alpha: np.ndarray, oc: int, ic: int, shape_int32: bool, asymmetric: bool):
    """(weight [oc, ic] as MNN computes it, scale per element [oc, ic]) from one IDST section."""
    width = 4 if shape_int32 else 2
    ndim = blob[0]
    pos = 1 + ndim * width
    n_table = blob[pos] or 256
    table = np.sort(np.frombuffer(blob, dtype=np.int8, count=n_table, offset=pos + 1)).astype(np.float32)
    pos += 1 + n_table
    bits = int(np.ceil(np.log2(n_table))) if n_table > 1 else 1
    n_bytes = -(-oc * ic * bits // 8)
    bit_rows = np.unpackbits(np.frombuffer(blob, np.uint8, n_bytes, pos))[: oc * ic * bits].reshape(-1, bits)
    index = np.zeros(oc * ic, dtype=np.int64)
    for column in range(bits):  # most significant bit first
        index = index * 2 + bit_rows[:, column]
    values = table[index].reshape(oc, ic)
    pairs = alpha.reshape(oc, -1, 2) if asymmetric else np.stack([np.zeros_like(alpha), alpha], -1).reshape(oc, -1, 2)
    block = ic // pairs.shape[1]
    low = np.repeat(pairs[:, :, 0], block, axis=1)
    scale = np.repeat(pairs[:, :, 1], block, axis=1)
    # MNN's zero point `low` is the weight at table value 0; the block minimum sits 2^(bits-1) steps lower
    return values * scale + low, scale, low - 2 ** (bits - 1) * scale * asymmetric, bits


def section(weights_bytes: bytes, conv):
    offset, weight_bytes, alpha_bytes, bias_bytes = conv.external[:4]
    alpha_dtype = "<f2" if conv.quanParameter.scaleStorage == "FP16" else "<f4"
    blob = weights_bytes[offset: offset + weight_bytes]
    alpha = np.frombuffer(weights_bytes, alpha_dtype, alpha_bytes // np.dtype(alpha_dtype).itemsize,
                          offset + weight_bytes).astype(np.float32)
    bias = np.frombuffer(weights_bytes, "<f4", bias_bytes // 4, offset + weight_bytes + alpha_bytes)
    return blob, alpha, bias


def step_error(ours: np.ndarray, truth: np.ndarray, scale: np.ndarray, low, bits: int, bf16_source: bool,
               fp16_scales: bool = False) -> float:
    """The worst |ours - truth| over its allowance; <= 1 passes.

    The allowance is half a quantization step (plus float rounding). When the checkpoint is
    bf16 the exporter quantizes in bf16 arithmetic, which keeps 8 significant bits: the code
    it computes, up to 2^bits, and the value it subtracts the minimum from are each off by up
    to 2^-8 relative, so bf16 sources get 2^(bits-7) steps and 2^-7 of |w - min| + |min| more
    (twice that analysis). Scales stored as fp16 (MNN's newer exporter, --scale_bit 16) and the
    minimum beside them are each rounded by up to 2^-11 relative after the codes were chosen: up
    to 2^bits - 1 codes times that of the step, and that of |min|, more."""
    scale = np.abs(scale)
    allowance = scale / 2 * (1 + 1e-4) + 1e-6
    if bf16_source:
        allowance = allowance + scale * 2.0 ** (bits - 7) + 2.0**-7 * (np.abs(truth - low) + np.abs(low))
    if fp16_scales:
        allowance = allowance + 2.0**-11 * (scale * (2**bits - 1) + np.abs(low))
    return float(np.max(np.abs(ours - truth) / allowance))


def bf16_checkpoint(name: str) -> bool:
    config = hf_config(name)
    return (config.get("dtype") or config.get("torch_dtype")) == "bfloat16"


@needs_fixtures
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_linear_layer_within_half_a_step_of_hf(name):
    folder = fixture_dir(name)
    net, tensors = read_net(folder / "llm.mnn"), hf_tensors(name)
    raw = (folder / "llm.mnn.weight").read_bytes()
    weights = WeightFile(folder / "llm.mnn.weight")
    bf16_source = bf16_checkpoint(name)
    convs = linear_layers(net)
    assert len(convs) == linears_in_layers(hf_config(name)) + split_projections(net) + 1
    for op_name, conv in convs:
        lin = read_linear(weights, conv, op_name)
        truth = hf_linear_truth(op_name, tensors, hf_config(name), lin.oc)
        assert truth.shape == (lin.oc, lin.ic)
        if not lin.is_quantized:  # --quant_bit 16: the source weights rounded to fp16
            assert lin.bits == 16 and not bf16_source
            np.testing.assert_array_equal(lin.dequantize(), truth.astype(np.float16).astype(np.float32), op_name)
            continue
        quan = conv.quanParameter
        blob, alpha, bias = section(raw, conv)
        expected, scale, low, bits = mnn_weight(blob, alpha, lin.oc, lin.ic, quan.shapeInt32, quan.readType != 0)
        assert lin.bits == bits and lin.bits == quan.aMaxOrBits
        ours = lin.dequantize()
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6, err_msg=op_name)
        fp16_scales = quan.scaleStorage == "FP16"
        assert step_error(expected, truth, scale, low, bits, bf16_source, fp16_scales) <= 1.0, op_name
        assert step_error(ours, truth, scale, low, bits, bf16_source, fp16_scales) <= 1.0, op_name
        codes = lin.unpacked_codes()
        assert codes.shape == (lin.oc, lin.ic) and int(codes.max()) < 2**lin.bits
        if lin.bits in (4, 8):   # other widths are unpacked into their own array
            assert not lin.codes.flags.writeable, "4/8-bit codes should be views of the read-only mapping"
        bias_name = hf_linear_name(op_name, tensors).replace(".weight", ".bias")
        if bias_name in tensors:
            np.testing.assert_array_equal(lin.bias, tensors[bias_name])
            np.testing.assert_array_equal(lin.bias, bias)
        elif lin.bias is not None:   # Phi-3's split qkv_proj is written with a zero bias
            assert not lin.bias.any() and not bias.any(), op_name
        else:
            assert bias.size == 0


@needs_fixtures
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_rows_of_a_linear_layer_alone(name):
    folder = fixture_dir(name)
    net = read_net(folder / "llm.mnn")
    lm_head = next(op for op in net.ops if "lm_head" in op.name and op.type == "Convolution")
    lin = read_linear(WeightFile(folder / "llm.mnn.weight"), lm_head.param, lm_head.name)
    rows = [lin.oc - 1, 0, 7, 7]
    np.testing.assert_array_equal(lin.dequantize(rows), lin.dequantize()[rows])
    if lin.is_quantized:
        np.testing.assert_array_equal(lin.unpacked_codes(slice(2, 5)), lin.unpacked_codes()[2:5])


@needs_fixtures
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_layernorm_gamma_equals_hf_norm_weights(name):
    folder = fixture_dir(name)
    net, tensors = read_net(folder / "llm.mnn"), hf_tensors(name)
    weights = WeightFile(folder / "llm.mnn.weight")
    norms = [op for op in net.ops if op.type == "LayerNorm"]
    if family(hf_config(name)) in NORMS_AS_PLAIN_OPS:
        assert not norms
        consts = [op.param.array().ravel() for op in net.ops if op.type == "Const"]
        for weight_name, weight in tensors.items():
            if weight_name.endswith("norm.weight"):
                assert any(np.array_equal(const, weight.ravel()) for const in consts), weight_name
        return
    assert norms
    for op in norms:
        gamma, beta = read_layernorm(weights, op.param, op.name)
        weight_name = hf_norm_name(op.name, tensors)
        offset = gamma_offset(hf_config(name), weight_name)
        np.testing.assert_array_equal(gamma, tensors[weight_name] + np.float32(offset), err_msg=op.name)
        bias = tensors.get(weight_name.replace(".weight", ".bias"))
        if bias is None:   # RMSNorm
            assert op.param.useRMSNorm and (beta is None or not beta.any())
        else:              # LayerNorm (Phi-2)
            assert not op.param.useRMSNorm
            np.testing.assert_array_equal(beta, bias, err_msg=op.name)


def gamma_offset(hf: dict, weight_name: str) -> float:
    """What the exporter adds to HF's norm weight: Gemma's and Qwen3.5's RMSNorm scale by 1 + weight,
    except Qwen3.5's gated norm inside a Gated DeltaNet layer, which scales by the weight."""
    if hf["model_type"].startswith("gemma"):
        return 1.0
    if hf["model_type"].startswith("qwen3_5"):
        return 0.0 if ".linear_attn.norm." in weight_name else 1.0
    return 0.0


def _tie_fields(config: dict) -> tuple[list, str]:
    """tie_embeddings as [weight_offset, alpha_offset, alpha_size, quant_bit, quant_block] and its alpha's
    numpy dtype: llmexport 0.0.5 writes a list (fp32 alpha), MNN's newer exporter an object with alpha_dtype."""
    tie = config["tie_embeddings"]
    if isinstance(tie, dict):
        return [tie[field] for field in TIE_FIELDS], {"fp32": "<f4", "fp16": "<f2"}[tie.get("alpha_dtype", "fp32")]
    return list(tie), "<f4"


def _embedding_rows_file(folder, config: dict) -> str:
    tie, _ = _tie_fields(config)
    if tie[0] != 0:
        return "llm.mnn.weight"
    return json.loads((folder / "config.json").read_text())["embedding_file"]


QUANTIZED_EMBEDDINGS = [n for n in FIXTURE_NAMES
                        if "tie_embeddings" in json.loads((fixture_dir(n) / "llm_config.json").read_text())]


@needs_fixtures
@pytest.mark.parametrize("name", QUANTIZED_EMBEDDINGS)
def test_quantized_embedding_rows_within_half_a_step_of_hf(name):
    folder = fixture_dir(name)
    config = json.loads((folder / "llm_config.json").read_text())
    hidden, (tie, alpha_dtype) = config["hidden_size"], _tie_fields(config)
    rows_file = folder / _embedding_rows_file(folder, config)
    layout = QuantizedRows.from_tie_embeddings(config["tie_embeddings"], hidden)
    truth = hf_tensors(name)["model.embed_tokens.weight"]
    ids = [0, 3, truth.shape[0] - 1, 3]
    got = read_quantized_rows(WeightFile(rows_file), layout, ids)

    # independent row decode: codes [vocab][hidden*bits/8] at tie[0], alpha at tie[1]
    raw = rows_file.read_bytes()
    offset, alpha_offset, alpha_bytes, bits, block = tie[:5]
    n_blocks = hidden // block if block else 1
    vocab = truth.shape[0]
    codes = np.unpackbits(np.frombuffer(raw, np.uint8, vocab * hidden * bits // 8, offset))
    codes = codes.reshape(vocab, hidden, bits) @ (1 << np.arange(bits - 1, -1, -1))
    alpha = np.frombuffer(raw, alpha_dtype, alpha_bytes // np.dtype(alpha_dtype).itemsize,
                          alpha_offset).astype(np.float32).reshape(vocab, n_blocks, -1)
    scale = np.repeat(alpha[:, :, -1], hidden // n_blocks, axis=1)
    low = np.repeat(alpha[:, :, 0], hidden // n_blocks, axis=1) if alpha.shape[2] == 2 else 0.0
    expected = (codes - 2 ** (bits - 1)) * scale + low
    block_min = low - 2 ** (bits - 1) * scale if alpha.shape[2] == 2 else 0.0

    assert got.shape == (len(ids), hidden)
    np.testing.assert_allclose(got, expected[ids], rtol=1e-5, atol=1e-6)
    block_min = block_min[ids] if isinstance(block_min, np.ndarray) else block_min
    assert step_error(got, truth[ids], scale[ids], block_min, bits, bf16_checkpoint(name)) <= 1.0
    if tie[0] != 0:  # tied: the same rows as the lm_head's
        net = read_net(folder / "llm.mnn")
        lm_head = next(op for op in net.ops if "lm_head" in op.name and op.type == "Convolution")
        lin = read_linear(WeightFile(folder / "llm.mnn.weight"), lm_head.param)
        np.testing.assert_allclose(read_quantized_rows(WeightFile(rows_file), lin, ids), got, rtol=1e-6, atol=1e-7)


def test_row_ids_out_of_range_are_an_input_error(tmp_path):
    from mnngpu.errors import InputError

    path = tmp_path / "rows.bin"
    path.write_bytes(bytes(4 * 8) + np.ones(4, "<f4").tobytes())  # 4 rows of 8 int8 codes, 1 scale each
    layout = QuantizedRows(0, 32, 16, 8, 0, 8)
    assert read_quantized_rows(WeightFile(path), layout, [3]).tolist() == [[-128.0] * 8]
    with pytest.raises(InputError):
        read_quantized_rows(WeightFile(path), layout, [4])
