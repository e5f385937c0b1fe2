"""read_linear on weight sections written by an encoder in this file, for layouts the
fixtures do not have: every bit width 1-8, odd widths, shuffled and sparse value tables,
u32 dims, fp16 alpha, negative aMin, quantScale, inline storage, fp16/fp32 weights.

The expected weight is MNN's formula computed from the encoder's own values:
w = value * scale + min', min' = min - aMin*scale when aMin < 0 (aMin 0 meaning -128), all
times quantScale.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnngpu.errors import ModelFormatError, WeightFileError
from mnngpu.format.params import Convolution2D, Convolution2DCommon, IDSTQuan
from mnngpu.format.quant import read_linear
from mnngpu.format.weights import WeightFile


def pack_msb_first(indices: np.ndarray, bits: int) -> bytes:
    bit_matrix = (indices[:, None] >> np.arange(bits - 1, -1, -1)) & 1
    return np.packbits(bit_matrix.astype(np.uint8).reshape(-1)).tobytes()


def idst_section(indices: np.ndarray, table_on_disk: np.ndarray, bits: int, oc: int, ic: int,
                 shape_int32: bool) -> bytes:
    dims = np.array([oc, ic], dtype="<u4" if shape_int32 else "<u2").tobytes()
    count = len(table_on_disk) % 256  # 0 stands for 256
    return bytes([2]) + dims + bytes([count]) + table_on_disk.astype(np.int8).tobytes() + pack_msb_first(indices, bits)


def make_case(rng: np.random.Generator, oc: int, ic: int, bits: int, n_blocks: int, symmetric: bool,
              table_kind: str, a_min: int, quant_scale: float, alpha_fp16: bool):
    half = 1 << (bits - 1)
    if table_kind == "linear":
        table = np.arange(-half, half)
    else:  # a sorted subset of int8 values, wider than the index range when bits is small
        size = int(rng.integers(2 if bits == 1 else half + 1, (1 << bits) + 1))
        table = np.sort(rng.choice(np.arange(-128, 128), size=size, replace=False))
    index_bits = max(1, (len(table) - 1).bit_length())
    indices = rng.integers(0, len(table), size=oc * ic)
    values = table[indices].reshape(oc, ic).astype(np.float32)
    scale = rng.uniform(0.01, 0.2, size=(oc, n_blocks)).astype(np.float32)
    low = rng.uniform(-1, 1, size=(oc, n_blocks)).astype(np.float32)
    if alpha_fp16:
        scale, low = scale.astype(np.float16).astype(np.float32), low.astype(np.float16).astype(np.float32)
    alpha = scale.reshape(-1) if symmetric else np.stack([low, scale], -1).reshape(-1)
    block = ic // n_blocks
    full_scale, full_low = np.repeat(scale, block, 1), np.repeat(low, block, 1)
    if symmetric:
        full_low = np.zeros_like(full_low)
    else:
        clamp_min = a_min if a_min != 0 else -128  # older exports wrote aMin 0 for -128
        if clamp_min < 0:
            full_low = full_low - clamp_min * full_scale
    expected = (values * full_scale + full_low) * np.float32(quant_scale)
    shuffled = rng.permutation(table)  # MNN sorts the table it reads
    return indices, shuffled, index_bits, alpha, expected


def quantized_conv(oc, ic, bits, symmetric, a_min, quant_scale, alpha_fp16, shape_int32, **storage) -> Convolution2D:
    quan = IDSTQuan(type=1, aMaxOrBits=bits, aMin=a_min, readType=0 if symmetric else oc,
                    quantScale=quant_scale, scaleStorage="FP16" if alpha_fp16 else "FP32", shapeInt32=shape_int32,
                    buffer=storage.get("buffer"), alpha=storage.get("alpha"), alphaFp16=storage.get("alpha_half"))
    return Convolution2D(common=Convolution2DCommon(outputCount=oc, inputCount=ic), quanParameter=quan,
                         external=storage.get("external"), bias=storage.get("bias"))


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(1, 8), oc=st.integers(1, 4), ic=st.integers(1, 33), data=st.data(),
       symmetric=st.booleans(), table_kind=st.sampled_from(["linear", "sparse"]), shape_int32=st.booleans(),
       alpha_fp16=st.booleans(), inline=st.booleans(), a_min=st.sampled_from([1, 0, -8]),
       quant_scale=st.sampled_from([1.0, 0.5]), seed=st.integers(0, 2**31 - 1))
def test_quantized_sections_decode_to_mnns_weights(bits, oc, ic, data, symmetric, table_kind, shape_int32,
                                                  alpha_fp16, inline, a_min, quant_scale, seed):
    n_blocks = data.draw(st.sampled_from([d for d in range(1, ic + 1) if ic % d == 0]))
    rng = np.random.default_rng(seed)
    indices, table, index_bits, alpha, expected = make_case(rng, oc, ic, bits, n_blocks, symmetric, table_kind,
                                                            a_min, quant_scale, alpha_fp16)
    section = idst_section(indices, table, index_bits, oc, ic, shape_int32)
    bias = rng.normal(size=oc).astype("<f4")
    alpha_bytes = alpha.astype("<f2" if alpha_fp16 else "<f4").tobytes()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "llm.mnn.weight"
        if inline:
            storage = {"buffer": np.frombuffer(section, np.int8), "bias": bias}
            storage["alpha_half" if alpha_fp16 else "alpha"] = np.frombuffer(alpha_bytes,
                                                                           "<u2" if alpha_fp16 else "<f4")
            path.write_bytes(b"")
        else:
            path.write_bytes(b"\x55" * 7 + section + alpha_bytes + bias.tobytes())
            storage = {"external": [7, len(section), len(alpha_bytes), 4 * oc, 0]}
        conv = quantized_conv(oc, ic, bits, symmetric, a_min, quant_scale, alpha_fp16, shape_int32, **storage)
        lin = read_linear(WeightFile(path), conv, "layer")
        np.testing.assert_allclose(lin.dequantize(), expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(lin.bias, bias)
    assert (lin.oc, lin.ic, lin.block_size, lin.symmetric) == (oc, ic, ic // n_blocks, symmetric)
    codes = lin.unpacked_codes()
    assert codes.shape == (oc, ic) and int(codes.max()) < 2**lin.bits
    assert lin.codes.shape == ((oc, (ic + 1) // 2) if lin.bits == 4 else (oc, ic))
    assert lin.scales.shape == lin.zeros.shape == (oc, n_blocks)
    rows = [oc - 1, 0]
    np.testing.assert_array_equal(lin.dequantize(rows), lin.dequantize()[rows])


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("dtype", ["<f2", "<f4"])
def test_float_weights(tmp_path, dtype, inline):
    oc, ic = 3, 5
    weight = np.random.default_rng(0).normal(size=(oc, ic)).astype(dtype)
    bias = np.arange(oc, dtype="<f4")
    path = tmp_path / "w"
    common = Convolution2DCommon(outputCount=oc, inputCount=ic)
    quan = IDSTQuan(type=3) if dtype == "<f2" else None
    if inline and quan is not None:
        conv = Convolution2D(common=common, quanParameter=IDSTQuan(type=3, buffer=weight.view(np.int8).reshape(-1)),
                             bias=bias)
    elif inline:
        conv = Convolution2D(common=common, weight=weight.reshape(-1), bias=bias)
    else:
        # fp16 keeps the quantized layout [off, w, alpha=0, bias, index]; fp32 is [off, w, bias]
        external = [3, weight.nbytes, 0, bias.nbytes, 0] if quan is not None else [3, weight.nbytes, bias.nbytes]
        conv = Convolution2D(common=common, quanParameter=quan, external=external)
    path.write_bytes(b"abc" + weight.tobytes() + bias.tobytes())
    lin = read_linear(WeightFile(path), conv)
    assert lin.bits == 8 * np.dtype(dtype).itemsize and not lin.is_quantized
    np.testing.assert_array_equal(lin.dequantize(), weight.astype(np.float32))
    np.testing.assert_array_equal(lin.bias, bias)
    with pytest.raises(ModelFormatError):
        lin.unpacked_codes()


def test_damaged_sections_are_reported(tmp_path):
    oc, ic = 2, 8
    section = idst_section(np.arange(16) % 16, np.arange(-8, 8), 4, oc, ic, False)
    alpha = np.ones(2 * oc, "<f4").tobytes()
    path = tmp_path / "w"
    path.write_bytes(section + alpha)

    def conv(external, **quan):
        return Convolution2D(common=Convolution2DCommon(outputCount=oc, inputCount=ic), external=external,
                             quanParameter=IDSTQuan(type=1, aMaxOrBits=4, aMin=1, readType=oc, **quan))

    good = [0, len(section), len(alpha), 0, 0]
    assert read_linear(WeightFile(path), conv(good)).bits == 4
    with pytest.raises(WeightFileError, match="offset"):
        read_linear(WeightFile(path), conv([0, len(section), len(alpha) + 4, 0, 0]))  # past the end
    with pytest.raises(ModelFormatError, match="dims"):
        read_linear(WeightFile(path), conv(good, shapeInt32=True))  # the dims read as u32
    with pytest.raises(ModelFormatError, match="codes"):
        read_linear(WeightFile(path), conv([0, len(section) - 1, len(alpha), 0, 0]))  # codes cut short
    with pytest.raises(ModelFormatError, match="sparse"):
        read_linear(WeightFile(path), conv([0, len(section), len(alpha), 0, 8]))
    with pytest.raises(WeightFileError):
        read_linear(None, conv(good))
