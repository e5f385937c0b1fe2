"""Every op, written once, on every backend kind this machine has (tests/backend/harness.py), against
tests/reference.py or plain numpy. A case a backend declines by design names that backend in
`declined_by`; the per-backend files keep only what is their own (kernel splits, recordings,
graphs, drivers)."""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu.backend import Node
from mnngpu.errors import ModelFormatError
from mnngpu.format import params as P
from mnngpu.format.quant import QuantizedLinear
from mnngpu.ops.pooling import pooling
from mnngpu.runtime import fusion
from mnngpu.runtime.graph import GraphOp
from tests import reference
from tests.backend.harness import (
    KINDS,
    OneOp,
    close,
    conv_node,
    fused_linear,
    linear_reference,
    make,
    quantized_linear,
    run,
    run_graph,
    stored,
)

# Backends without a kernel for an op family: the case then checks the decline and the CPU result.
NO_INT_ELEMENTWISE = ("opencl", "cuda")
NO_FUSED_LINEAR = ("opencl", "cuda")


@pytest.fixture(params=list(KINDS))
def backend(request):
    return make(request.param)


# ---- Convolution (linear) and its fused forms --------------------------------------------------------

@pytest.mark.parametrize("bits, block", [(4, 32), (4, 64), (4, 16), (8, 48), (8, 192), (3, 32)])
@pytest.mark.parametrize("rows", [1, 13])
def test_quantized_linear(backend, bits, block, rows):
    rng = np.random.default_rng(bits * 100 + block + rows)
    weight, dense = quantized_linear(rng, oc=40, ic=192, bits=bits, block=block, bias=rows == 13)
    x = stored(backend, rng.normal(0, 1, (rows, 192, 1, 1)))
    got = run(backend, conv_node(weight), [x])
    close(backend, got.reshape(rows, 40), linear_reference(x.reshape(rows, 192), dense, weight.bias))


@pytest.mark.parametrize("rows", [1, 9])
def test_float_linear(backend, rows):
    rng = np.random.default_rng(rows)
    w = rng.normal(0, 0.2, (24, 40)).astype(np.float32)
    weight = QuantizedLinear(24, 40, 32, 40, False, np.zeros((24, 0), np.uint8), np.zeros((24, 0), np.float32),
                             np.zeros((24, 0), np.float32), None, float_weight=w)
    x = stored(backend, rng.normal(0, 1, (rows, 40, 1, 1)))
    got = run(backend, conv_node(weight), [x])
    close(backend, got.reshape(rows, 24), x.reshape(rows, 40).astype(np.float64) @ w.astype(np.float64).T)


@pytest.mark.parametrize("rows", [1, 9])
def test_linear_group_gives_each_members_output(backend, rows):
    rng = np.random.default_rng(3 + rows)
    layers = [quantized_linear(rng, oc, 128, 4, 64, bias=True) for oc in (96, 32, 30)]
    x = stored(backend, rng.normal(0, 1, (rows, 128, 1, 1)))
    node = fused_linear(fusion.LINEAR_GROUP, [w for w, _ in layers])
    op = OneOp(backend, node, [x], declined_by=NO_FUSED_LINEAR)
    for got, (weight, dense) in zip(op(x), layers, strict=True):
        close(op.backend, got.reshape(rows, -1), linear_reference(x.reshape(rows, 128), dense, weight.bias))


@pytest.mark.parametrize("bits, block", [(4, 64), (8, 32)])
@pytest.mark.parametrize("rows", [1, 9])
def test_gated_linear_is_up_times_silu_gate(backend, bits, block, rows):
    rng = np.random.default_rng(5 + rows + bits)
    (gate, gate_w), (up, up_w) = (quantized_linear(rng, 200, 128, bits, block, bias=True) for _ in range(2))
    x = stored(backend, rng.normal(0, 1, (rows, 128, 1, 1)))
    op = OneOp(backend, fused_linear(fusion.GATED_LINEAR, [gate, up]), [x], declined_by=NO_FUSED_LINEAR)
    g = linear_reference(x.reshape(rows, 128), gate_w, gate.bias)
    u = linear_reference(x.reshape(rows, 128), up_w, up.bias)
    # MUL_SILU's exp on the CPU is a vectorizable approximation (relative error below 5e-5)
    close(op.backend, op(x)[0].reshape(rows, 200), reference.silu_mul(u, g), fp32=5e-5)


# ---- LayerNorm ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rms, with_gamma, with_beta, shape, axes", [
    (True, True, False, (1, 5, 96), 1),
    (True, True, False, (1, 3, 4, 32), 1),      # qwen3's q/k norm over head_dim
    (False, True, True, (2, 7, 130), 1),
    (True, True, False, (3, 7), 1),
    (True, False, False, (3, 4, 16), 2),
])
def test_layer_norm(backend, rms, with_gamma, with_beta, shape, axes):
    rng = np.random.default_rng(len(shape) + axes)
    x = stored(backend, rng.normal(0.5, 2, shape))
    n = int(np.prod(shape[-axes:]))
    gamma = rng.normal(1, 0.1, n).astype(np.float32) if with_gamma else None
    beta = rng.normal(0, 0.1, n).astype(np.float32) if with_beta else None
    param = P.LayerNorm(axis=list(range(-axes, 0)), epsilon=1e-5, useRMSNorm=rms)
    got = run(backend, Node("LayerNorm", "norm", param, {"gamma": gamma, "beta": beta}), [x])
    rows = x.reshape(-1, n)
    if rms:
        want = reference.rms_norm(rows, gamma if gamma is not None else np.ones(n), 1e-5)
    else:
        want = reference.layer_norm(rows, gamma, beta, 1e-5)
    close(backend, got.reshape(-1, n), want)


# ---- Attention --------------------------------------------------------------------------------------------

def attention_node(scale: float = 0.0, output_c4: bool = False) -> Node:
    return Node("Attention", "attn0", P.AttentionParam(layer_index=0, attnScale=scale, output_c4=output_c4))


def attention_inputs(backend, rng, seq, heads, kv_heads, dim):
    q = stored(backend, rng.normal(0, 1, (1, seq, heads, dim)))
    k = stored(backend, rng.normal(0, 1, (1, seq, kv_heads, dim)))
    v = stored(backend, rng.normal(0, 1, (seq, kv_heads * dim, 1, 1)))
    return [q, k, v, np.zeros((1, 1, 1, 1), np.float32)]


@pytest.mark.parametrize("heads, kv_heads, dim, scale, config_scale, output_c4",
                         [(4, 2, 32, 0.0, 0.0, True), (2, 2, 16, 0.3, 0.5, False), (6, 1, 64, 0.0, 0.0, False),
                          (2, 1, 6, 0.0, 0.0, True), (2, 2, 16, 0.0, 0.45, False)])
def test_attention_padded_prefill_then_decode(backend, heads, kv_heads, dim, scale, config_scale, output_c4):
    """A padded prefill (8 rows, 5 real) then two decode steps: the cache holds exactly the real
    tokens, the padded rows are overwritten, and each row sees its causal past. The scale is the
    op's own; where the op records none, the config's attn_scale (KVMeta); else 1/sqrt(dim)."""
    rng = np.random.default_rng(heads * dim)
    meta = backend.kv_meta
    meta.attn_scale = config_scale
    node = attention_node(scale, output_c4)
    prefill_in = attention_inputs(backend, rng, 8, heads, kv_heads, dim)
    prefill = OneOp(backend, node, prefill_in)
    decode = OneOp(backend, node, attention_inputs(backend, rng, 1, heads, kv_heads, dim))
    scale = scale or config_scale or 1 / np.sqrt(dim)
    meta.add = 5
    got = prefill(*prefill_in)[0]
    meta.sync()
    keys, values = [prefill_in[1][0, :5]], [prefill_in[2].reshape(8, kv_heads, dim)[:5]]
    want = reference.causal_attention(prefill_in[0][0], prefill_in[1][0], prefill_in[2].reshape(8, kv_heads, dim), 0,
                                      scale)
    assert got.shape == ((8, heads * dim, 1, 1) if output_c4 else (1, 8, heads * dim))
    close(backend, got.reshape(8, heads, dim)[:5], want[:5])
    for _ in range(2):
        step = attention_inputs(backend, rng, 1, heads, kv_heads, dim)
        meta.add = 1
        got = decode(*step)[0]
        meta.sync()
        keys.append(step[1][0])
        values.append(step[2].reshape(1, kv_heads, dim))
        want = reference.causal_attention(step[0][0], np.concatenate(keys), np.concatenate(values),
                                          meta.previous - 1, scale)
        close(backend, got.reshape(1, heads, dim), want)


def test_attention_sliding_window_cuts_prefill_chunks_and_decode(backend):
    """A sliding layer's mask input names a key window of 3 (known at resize): every query sees
    only its last 3 positions, in a padded first chunk (5 of 8 rows real), in a second chunk that
    starts behind the first, and in decode steps."""
    rng = np.random.default_rng(11)
    heads, kv_heads, dim, window = 4, 2, 16, 3
    meta = backend.kv_meta
    node = attention_node()
    keys, values = [], []
    for seq, real in ((8, 5), (8, 7), (1, 1), (1, 1)):
        step = attention_inputs(backend, rng, seq, heads, kv_heads, dim)
        step[3] = np.full((1, 1, 1, 1), window, np.float32)
        meta.add = real
        got = OneOp(backend, node, step, host=(3,))(*step)[0].reshape(seq, heads, dim)[:real]
        past = meta.previous
        meta.sync()
        keys.append(step[1][0, :real])
        values.append(step[2].reshape(seq, kv_heads, dim)[:real])
        want = reference.causal_attention(step[0][0, :real], np.concatenate(keys), np.concatenate(values), past,
                                          1 / np.sqrt(dim), window)
        close(backend, got, want)
        unwindowed = reference.causal_attention(step[0][0, :real], np.concatenate(keys), np.concatenate(values),
                                                past, 1 / np.sqrt(dim))
        assert np.abs(unwindowed[-1] - want[-1]).max() > 1e-2   # the window really cut the last row


def test_attention_reserve_keeps_spans(backend):
    """KVMeta.reserve: of the 3 removed tokens only the middle one stays, moved behind the kept ones."""
    rng = np.random.default_rng(3)
    meta = backend.kv_meta
    node = attention_node()
    first = attention_inputs(backend, rng, 6, 2, 1, 16)
    meta.add = 6
    OneOp(backend, node, first)(*first)
    meta.sync()
    meta.remove, meta.reserve = 3, [(1, 1)]
    step = attention_inputs(backend, rng, 1, 2, 1, 16)
    meta.add = 1
    got = OneOp(backend, node, step)(*step)[0]
    kept = [0, 1, 2, 4]
    keys = np.concatenate([first[1][0, kept], step[1][0]])
    values = np.concatenate([first[2].reshape(6, 1, 16)[kept], step[2].reshape(1, 1, 16)])
    close(backend, got.reshape(1, 2, 16), reference.causal_attention(step[0][0], keys, values, 4, 1 / 4))


# ---- elementwise -------------------------------------------------------------------------------------------

def positive_pair(backend, rng, shape_a, shape_b):
    return stored(backend, rng.uniform(0.5, 3, shape_a)), stored(backend, rng.uniform(0.5, 3, shape_b))


@pytest.mark.parametrize("op", sorted(reference.BINARY))
def test_binary_broadcasts(backend, op):
    rng = np.random.default_rng(len(op))
    a, b = positive_pair(backend, rng, (2, 3, 4, 5), (3, 1, 5))
    a[0, 0, 0, :2] = b[0, 0, :2]            # equal pairs for the comparisons
    node = Node("BinaryOp", op, P.BinaryOp(opType=op))
    fp32 = 5e-5 if op == "MUL_SILU" else 1e-5
    close(backend, run(backend, node, [a, b]), reference.BINARY[op](a.astype(np.float64), b.astype(np.float64)), fp32)
    close(backend, run(backend, node, [b, a]), reference.BINARY[op](b.astype(np.float64), a.astype(np.float64)), fp32)


def test_binary_with_host_constant(backend):
    """RoPE's positions x inv_freq: a device tensor times a constant uploaded once."""
    positions = np.arange(7, dtype=np.float32).reshape(7, 1)
    inv_freq = stored(backend, np.random.default_rng(1).uniform(0, 1, 16))
    got = run(backend, Node("BinaryOp", "mul", P.BinaryOp(opType="MUL")), [positions, inv_freq], host=(1,))
    close(backend, got, positions * inv_freq.astype(np.float64))


@pytest.mark.parametrize("op, want", [
    ("ADD", lambda a, b: a + b), ("SUB", lambda a, b: a - b), ("MUL", lambda a, b: a * b),
    ("REALDIV", lambda a, b: np.trunc(a / b)), ("FLOORDIV", lambda a, b: np.floor(a / b)),
    ("MOD", lambda a, b: a - np.floor(a / b) * b), ("MAXIMUM", np.maximum), ("MINIMUM", np.minimum),
    ("LESS", lambda a, b: a < b), ("EQUAL", lambda a, b: a == b),
])
def test_int_binary(backend, op, want):
    a = np.array([[-7, -3, 0, 4, 9, 13]], dtype=np.int32)
    b = np.array([[2], [-3], [5]], dtype=np.int32)
    got = run(backend, Node("BinaryOp", op, P.BinaryOp(opType=op)), [a, b], declined_by=NO_INT_ELEMENTWISE)
    assert got.dtype == np.int32
    assert np.array_equal(got, want(a.astype(np.float64), b.astype(np.float64)).astype(np.int32))


UNARY_DOMAIN = {"ACOS": (-0.99, 0.99), "ASIN": (-0.99, 0.99), "LOG": (0.1, 5), "SQRT": (0.1, 5), "RSQRT": (0.1, 5),
                "TAN": (-1.2, 1.2), "RECIPROCAL": (0.2, 4)}


@pytest.mark.parametrize("op", sorted(reference.UNARY))
def test_unary(backend, op):
    low, high = UNARY_DOMAIN.get(op, (-4, 4))
    x = np.random.default_rng(len(op)).uniform(low, high, (3, 50)).astype(np.float32)
    x[0, :3] = [low, 0.5 * (low + high), 2.5 if op == "ROUND" else high]
    if op == "ROUND":
        x[1, :4] = [0.5, 1.5, -2.5, 2.4999]    # half to even, like numpy
    x = stored(backend, x)
    got = run(backend, Node("UnaryOp", op, P.UnaryOp(opType=op)), [x])
    close(backend, got, reference.UNARY[op](x.astype(np.float64)), 5e-5 if op in ("SIGMOID", "SILU") else 1e-5)


def test_cast(backend):
    ints = np.array([[-3, 0, 7, 2**10]], dtype=np.int32)
    got = run(backend, Node("Cast", "c", P.CastParam(dstT="DT_FLOAT")), [ints])
    assert got.dtype == np.float32 and np.array_equal(got, ints.astype(np.float64))
    floats = np.array([[-2.75, -0.25, 0.0, 3.875, 1000.5]], dtype=np.float32)
    got = run(backend, Node("Cast", "c", P.CastParam(dstT="DT_INT32")), [floats])
    assert got.dtype == np.int32 and np.array_equal(got, np.trunc(floats.astype(np.float64)))


@pytest.mark.parametrize("heads, kv_heads, dim, scale", [(4, 4, 16, 0.0), (4, 2, 8, 0.3)])
def test_encoder_attention_sees_every_key_and_adds_the_mask(backend, heads, kv_heads, dim, scale):
    """kv_cache false (a vision encoder's Attention): no KV cache, no causal mask, the mask input added."""
    rng = np.random.default_rng(heads + dim)
    seq = 6
    q, k, v = (stored(backend, rng.normal(0, 1, (1, seq, n, dim))) for n in (heads, kv_heads, kv_heads))
    mask = np.zeros((1, seq, seq), np.float32)
    mask[0, :, 4:] = np.finfo(np.float32).min   # two blocks, as a window mask: rows see only their block
    mask[0, 4:, :4] = np.finfo(np.float32).min
    node = Node("Attention", "attn", P.AttentionParam(kv_cache=False, attnScale=scale))
    got = run(backend, node, [q, k, v, mask], declined_by=("cuda",))
    want = reference.full_attention(q[0], k[0], v[0], mask[0], scale or 1 / np.sqrt(dim))
    close(backend, got.reshape(seq, heads, dim), want)


def test_patch_convolution_is_a_linear_layer_over_each_window(backend):
    """A 14x14 kernel over a [n, 3, 14, 14] input (Qwen2-VL's patch embedding): one output per image."""
    rng = np.random.default_rng(14)
    w = rng.normal(0, 0.05, (8, 3, 14, 14)).astype(np.float32)
    weight = QuantizedLinear(8, 3 * 14 * 14, 32, 3 * 14 * 14, False, np.zeros((8, 0), np.uint8),
                             np.zeros((8, 0), np.float32), np.zeros((8, 0), np.float32), None,
                             float_weight=w.reshape(8, -1))
    common = P.Convolution2DCommon(inputCount=3, outputCount=8, kernelX=14, kernelY=14, strideX=14, strideY=14)
    x = stored(backend, rng.normal(0, 1, (5, 3, 14, 14)))
    # vulkan's linear kernels take an input width that is a multiple of 8 (3*14*14 = 588 is not)
    got = run(backend, Node("Convolution", "patch", P.Convolution2D(common=common), {"weight": weight}), [x],
              declined_by=("vulkan",))
    want = np.einsum("nchw,ochw->no", x.astype(np.float64), w.astype(np.float64))
    assert got.shape == (5, 8, 1, 1)
    close(backend, got.reshape(5, 8), want)


@pytest.mark.parametrize("shape, kernel, stride, pads", [
    ((1, 6, 11), (3, 1), (1, 1), (1, 0, 1, 0)),   # Qwen2-Audio's conv1 over time: [n, c, length] input
    ((2, 6, 11), (3, 1), (2, 1), (1, 0, 1, 0)),   # its stride-2 conv2
    ((1, 4, 7, 6), (3, 2), (2, 1), (0, 1, 2, 0)),
])
def test_windowed_convolution_slides_its_window(backend, shape, kernel, stride, pads):
    """A convolution whose window slides (padded, strided; a 3-D input as [n, c, h, 1]) runs on the
    CPU: the device backends decline it. Truth: the sum written out per output position."""
    rng = np.random.default_rng(31)
    (kh, kw), (sh, sw), (top, left, bottom, right) = kernel, stride, pads
    c, oc = shape[1], 5
    w = rng.normal(0, 0.3, (oc, c, kh, kw)).astype(np.float32)
    bias = rng.normal(0, 0.1, oc).astype(np.float32)
    weight = QuantizedLinear(oc, c * kh * kw, 32, c * kh * kw, False, np.zeros((oc, 0), np.uint8),
                             np.zeros((oc, 0), np.float32), np.zeros((oc, 0), np.float32), bias,
                             float_weight=w.reshape(oc, -1))
    common = P.Convolution2DCommon(inputCount=c, outputCount=oc, kernelY=kh, kernelX=kw, strideY=sh, strideX=sw,
                                   pads=[top, left, bottom, right])
    x = stored(backend, rng.normal(0, 1, shape))
    got = run(backend, Node("Convolution", "conv", P.Convolution2D(common=common), {"weight": weight}), [x],
              declined_by=("opencl", "vulkan", "cuda"))
    x4 = np.pad(x.reshape(*shape, 1) if len(shape) == 3 else x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    oh, ow = (x4.shape[2] - kh) // sh + 1, (x4.shape[3] - kw) // sw + 1
    want = np.zeros((shape[0], oc, oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            window = x4[:, :, oy * sh: oy * sh + kh, ox * sw: ox * sw + kw].astype(np.float64)
            want[:, :, oy, ox] = np.einsum("nchw,ochw->no", window, w.astype(np.float64)) + bias
    assert got.shape == want.shape[:len(shape)]
    close(backend, got.reshape(want.shape), want)


@pytest.mark.parametrize("transpose_a, transpose_b", [(False, False), (True, False), (False, True)])
def test_matmul_of_two_inputs(backend, transpose_a, transpose_b):
    """The audio encoder's attention: [b, heads, n, d] @ [b, heads, d, n] (batched, broadcast)."""
    rng = np.random.default_rng(32)
    a = rng.normal(size=(1, 3, 5, 4)).astype(np.float32)
    b = rng.normal(size=(3, 4, 6)).astype(np.float32)
    a_in = np.swapaxes(a, -1, -2).copy() if transpose_a else a
    b_in = np.swapaxes(b, -1, -2).copy() if transpose_b else b
    node = Node("MatMul", "m", P.MatMul(transposeA=transpose_a, transposeB=transpose_b))
    got = run(backend, node, [stored(backend, a_in), stored(backend, b_in)], declined_by=HOST_MOVEMENT)
    want = np.einsum("xhnd,hdm->xhnm", a.astype(np.float64), b.astype(np.float64))
    assert got.shape == (1, 3, 5, 6)
    close(backend, got, want)


@pytest.mark.parametrize("pool_type, shape, kernel, stride", [
    ("AVEPOOL", (1, 4, 10), (2, 1), (2, 1)),     # Qwen2-Audio's avg_pooler over time
    ("MAXPOOL", (2, 3, 6, 5), (2, 2), (2, 1)),
])
def test_pooling(backend, pool_type, shape, kernel, stride):
    rng = np.random.default_rng(33)
    x = stored(backend, rng.normal(size=shape))
    (kh, kw), (sh, sw) = kernel, stride
    node = Node("Pooling", "pool", P.Pool(type=pool_type, kernelY=kh, kernelX=kw, strideY=sh, strideX=sw,
                                          ceilModel=False))
    got = run(backend, node, [x], declined_by=HOST_MOVEMENT)
    x4 = x.reshape(*shape, 1) if len(shape) == 3 else x
    oh, ow = (x4.shape[2] - kh) // sh + 1, (x4.shape[3] - kw) // sw + 1
    reduce = np.max if pool_type == "MAXPOOL" else np.mean
    want = np.array([[[[reduce(x4[n, c, i * sh: i * sh + kh, j * sw: j * sw + kw]) for j in range(ow)]
                       for i in range(oh)] for c in range(shape[1])] for n in range(shape[0])])
    assert got.shape == want.shape[:len(shape)]
    close(backend, got.reshape(want.shape), want)


def test_padded_pooling_is_refused():
    node = Node("Pooling", "pool", P.Pool(type="AVEPOOL", kernelY=2, kernelX=2, strideY=1, strideX=1, pads=[1, 1]))
    with pytest.raises(ModelFormatError, match="unpadded"):
        pooling(node, [np.zeros((1, 1, 4, 4), np.float32)])


# ---- data movement ------------------------------------------------------------------------------------------

HOST_MOVEMENT = ("opencl", "vulkan", "cuda")   # the vision graphs' movement ops run on the CPU (mnngpu/ops/)


def test_slice_tf_transpose_permute(backend):
    x = stored(backend, np.random.default_rng(4).normal(size=(2, 3, 4, 5)))
    begin, size = np.array([1, 0, 1, 2], np.int32), np.array([-1, 2, 3, -1], np.int32)
    got = run(backend, Node("SliceTf", "s", None), [x, begin, size], (1, 2), declined_by=HOST_MOVEMENT)
    assert np.array_equal(got, x[1:, 0:2, 1:4, 2:])
    perm = np.array([0, 2, 1, 3], np.int32)
    got = run(backend, Node("Transpose", "t", P.Transpose()), [x, perm], (1,), declined_by=HOST_MOVEMENT)
    assert np.array_equal(got, x.transpose(0, 2, 1, 3))
    got = run(backend, Node("Permute", "p", P.Permute(dims=[3, 0, 2, 1])), [x], declined_by=HOST_MOVEMENT)
    assert np.array_equal(got, x.transpose(3, 0, 2, 1))


def test_unpack_gives_one_output_per_slice(backend):
    x = stored(backend, np.random.default_rng(5).normal(size=(3, 4, 2, 5)))
    parts = OneOp(backend, Node("Unpack", "u", P.Axis(axis=2)), [x], declined_by=HOST_MOVEMENT)(x)
    assert len(parts) == 2 and all(np.array_equal(p, x[:, :, i]) for i, p in enumerate(parts))


def test_eltwise_sum(backend):
    rng = np.random.default_rng(6)
    a, b = (stored(backend, rng.normal(size=(4, 8, 1, 1))) for _ in range(2))
    got = run(backend, Node("Eltwise", "e", P.Eltwise(type="SUM")), [a, b], declined_by=HOST_MOVEMENT)
    assert np.array_equal(got, a + b)


@pytest.mark.parametrize("largest", [False, True])
def test_top_k_sorts_and_gives_indices(backend, largest):
    """Qwen2.5-VL's argsort of its window order (smallest first: the device kernels decline it)."""
    x = np.array([[4, 0, 7, 1, 3], [2, 9, 5, 5, 0]], dtype=np.float32)
    declined_by = ROUTING_DECLINED_BY if largest else HOST_MOVEMENT
    values, indices = OneOp(backend, Node("TopKV2", "k", P.TopKV2(sorted=True, largest=largest)),
                            [x, np.array(3, np.int32)], host=(1,), declined_by=declined_by)(x, None)
    want = np.argsort(-x if largest else x, axis=1, kind="stable")[:, :3]
    assert indices.dtype == np.int32 and np.array_equal(indices, want)
    assert np.array_equal(values, np.take_along_axis(x, want, axis=1))


@pytest.mark.parametrize("kernel, stride, shape", [((2, 1), (2, 1), (1, 6, 2, 9)), ((2, 3), (1, 2), (2, 2, 5, 7))])
def test_im2col(backend, kernel, stride, shape):
    x = stored(backend, np.random.default_rng(7).normal(size=shape))
    common = P.Convolution2DCommon(kernelY=kernel[0], kernelX=kernel[1], strideY=stride[0], strideX=stride[1])
    got = run(backend, Node("Im2Col", "i", P.Convolution2D(common=common)), [x], declined_by=HOST_MOVEMENT)
    assert np.array_equal(got, reference.im2col(x, *kernel, *stride))


@pytest.mark.parametrize("node, shape", [
    (Node("Reshape", "r", P.Reshape(dims=[4, 6])), (4, 6)),
    (Node("Squeeze", "s", P.SqueezeParam(squeezeDims=[0])), (2, 3, 4)),
    (Node("Unsqueeze", "u", P.SqueezeParam(squeezeDims=[4])), (1, 2, 3, 4, 1)),
    (Node("ConvertTensor", "c", None), (1, 2, 3, 4)),
], ids=["reshape", "squeeze", "unsqueeze", "convert"])
def test_views_keep_values(backend, node, shape):
    x = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    assert np.array_equal(run(backend, node, [x]), x.reshape(shape))


@pytest.mark.parametrize("starts, ends, axes, steps, index", [
    ([0], [16], [-1], [1], np.s_[..., 0:16]),
    ([16], [32], [3], [1], np.s_[:, :, :, 16:32]),
    ([-1], [-1000], [1], [-2], np.s_[:, ::-2]),
    ([1, 0], [3, 5], [1, 2], [1, 2], np.s_[:, 1:3, 0:5:2]),
])
def test_onnx_slice(backend, starts, ends, axes, steps, index):
    x = stored(backend, np.random.default_rng(0).normal(size=(1, 5, 4, 32)))
    arrays = [x, *(np.array(v, dtype=np.int32) for v in (starts, ends, axes, steps))]
    node = Node("StridedSlice", "s", P.StridedSliceParam(fromType=1))
    assert np.array_equal(run(backend, node, arrays, (1, 2, 3, 4)), x[index])


@pytest.mark.parametrize("begin, end, strides, masks, index", [
    ([0, -1, 0], [1, 0, 8], [1, 1, 1], {"shrinkAxisMask": 2, "beginMask": 1, "endMask": 1}, np.s_[:, -1, 0:8]),
    ([0, 1], [0, 3], [1, 1], {"ellipsisMask": 1}, np.s_[..., 1:3]),
    ([0, 0, 2], [0, 0, 6], [1, 1, 2], {"newAxisMask": 2, "beginMask": 1, "endMask": 1}, np.s_[:, None, 2:6:2]),
])
def test_tf_strided_slice(backend, begin, end, strides, masks, index):
    x = stored(backend, np.random.default_rng(1).normal(size=(3, 4, 8)))
    arrays = [x, *(np.array(v, dtype=np.int32) for v in (begin, end, strides))]
    node = Node("StridedSlice", "s", P.StridedSliceParam(fromType=0, **masks))
    assert np.array_equal(run(backend, node, arrays, (1, 2, 3)), x[index])


@pytest.mark.parametrize("indices, axis, dtype", [(np.array(1), 0, np.float32), (np.array([2, 0, 3, 3]), 1, np.float32),
                                                  (np.array([-1, 0]), 2, np.float32),
                                                  (np.array([[0, 1], [1, 0]]), 0, np.int32)])
def test_gather_with_host_indices(backend, indices, axis, dtype):
    x = stored(backend, np.random.default_rng(2).normal(size=(2, 4, 3, 5)) * 10).astype(dtype)
    arrays = [x, indices.astype(np.int32), np.array(axis, dtype=np.int32)]
    got = run(backend, Node("GatherV2", "g", P.GatherV2()), arrays, (1, 2))
    assert got.dtype == dtype and np.array_equal(got, np.take(x, indices % x.shape[axis], axis=axis))


@pytest.mark.parametrize("axis, shapes_in, dtype", [(0, [(1, 3, 16), (2, 3, 16)], np.float32),
                                                    (-1, [(2, 3, 16), (2, 3, 16), (2, 3, 4)], np.float32),
                                                    (1, [(2, 1, 4), (2, 5, 4)], np.int32)])
def test_concat(backend, axis, shapes_in, dtype):
    rng = np.random.default_rng(3)
    arrays = [rng.integers(-50, 50, s).astype(dtype) for s in shapes_in]
    got = run(backend, Node("Concat", "c", P.Axis(axis=axis)), arrays)
    assert got.dtype == dtype and np.array_equal(got, np.concatenate(arrays, axis=axis))


# ---- Fill: a tensor of the shape input 0 gives, every element the value of input 1 ------------------------

NO_FILL_KERNEL = ("opencl", "vulkan", "cuda")   # a Fill the host cannot fold runs on the CPU


@pytest.mark.parametrize("dims, dtype", [([2, 3, 4], np.float32), ([5], np.int32), ([3, 0], np.float32)])
def test_fill_of_a_device_value(backend, dims, dtype):
    value = np.array([7], dtype=dtype) if dtype == np.int32 else stored(backend, np.array([-2.5]))
    node = Node("Fill", "f", P.Fill())
    got = run(backend, node, [np.array(dims, np.int32), value], host=(0,), declined_by=NO_FILL_KERNEL)
    want = np.full(dims, value[0])
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_fill_of_a_shape_and_a_constant_is_folded(backend):
    """LFM2's pattern: Fill(Shape(x), constant) is known at resize, so every backend folds it on the
    host and the op reading it gets a constant."""
    x = stored(backend, np.random.default_rng(12).normal(size=(2, 3, 4)))
    ops = [GraphOp(Node("Shape", "s"), [0], [2]), GraphOp(Node("Fill", "f"), [2, 1], [3]),
           GraphOp(Node("BinaryOp", "add", P.BinaryOp(opType="ADD")), [0, 3], [4])]
    pipeline, got = run_graph(backend, ops, {1: np.array(0.5, np.float32)}, [x], 4)
    assert [a.backend for a in pipeline.assignments[:2]] == [None, None]
    close(backend, got, x + np.full(x.shape, 0.5))


# ---- the fused rotate-half ---------------------------------------------------------------------------------

@pytest.mark.parametrize("split, cos_shape", [(16, (1, 5, 1, 32)), (12, (5, 1, 32)), (16, (1, 5, 3, 32))])
def test_fused_rope(backend, split, cos_shape):
    rng = np.random.default_rng(13)
    ops, constants = reference.rotate_half_graph(split, axis=3)
    (fused,) = fusion.fuse(ops, {fusion.ROPE}, {17})
    x = stored(backend, rng.normal(0, 1, (1, 5, 3, 32)))
    cos, sin = (stored(backend, rng.normal(0, 1, cos_shape)) for _ in range(2))
    arrays = [x, cos, sin, *(constants[i] for i in fused.inputs[3:])]
    got = run(backend, fused.node, arrays, host=tuple(range(3, len(arrays))), declined_by=("cuda",))
    rotated = np.concatenate([-x[..., split:], x[..., :split]], axis=-1)
    close(backend, got, x.astype(np.float64) * cos + rotated * sin)


# ---- the MoE router and ExpertAdd -------------------------------------------------------------------------

ROUTING_DECLINED_BY = ("cuda",)   # no routing kernels on CUDA: it declines them (backends/cuda)


@pytest.mark.parametrize("shape, axis", [((1, 7, 4), -1), ((3, 128), 1), ((2, 5, 3), 1)])
def test_softmax(backend, shape, axis):
    x = stored(backend, np.random.default_rng(21).normal(0, 3, shape))
    got = run(backend, Node("Softmax", "s", P.Axis(axis=axis)), [x], declined_by=ROUTING_DECLINED_BY)
    close(backend, got, reference.softmax(x, axis))


@pytest.mark.parametrize("shape, k", [((1, 9, 4), 2), ((2, 128), 8), ((3, 5), 5)])
def test_top_k_picks_largest_first(backend, shape, k):
    rng = np.random.default_rng(22)
    x = stored(backend, rng.permutation(np.prod(shape)).reshape(shape) / 7.0 - 3)
    x.reshape(-1, shape[-1])[0, :3] = x.reshape(-1, shape[-1])[0].max()   # a three-way tie for first
    arrays = [x, np.array(k, dtype=np.int32)]
    node = Node("TopKV2", "t", P.TopKV2(sorted=True, largest=True))
    one = OneOp(backend, node, arrays, host=(1,), declined_by=ROUTING_DECLINED_BY)
    values, indices = one(*arrays)
    want_values, want_indices = reference.top_k_last_axis(x, k)
    assert indices.dtype == np.int32 and np.array_equal(indices, want_indices)
    assert np.array_equal(values, want_values)


@pytest.mark.parametrize("op, numpy_op", [("SUM", np.sum), ("MEAN", np.mean), ("MAXIMUM", np.max),
                                          ("MINIMUM", np.min), ("PROD", np.prod)])
@pytest.mark.parametrize("axes, keep", [([-1], True), ([1], False), ([1, 2], True)])
def test_reduction(backend, op, numpy_op, axes, keep):
    x = stored(backend, np.random.default_rng(23).uniform(0.5, 1.5, (2, 3, 4)))
    node = Node("Reduction", "r", P.ReductionParam(operation=op, keepDims=keep))
    got = run(backend, node, [x, np.array(axes, dtype=np.int32)], host=(1,), declined_by=ROUTING_DECLINED_BY)
    close(backend, got, numpy_op(x.astype(np.float64), axis=tuple(axes), keepdims=keep))


def test_expert_add_chain_is_the_sparse_mixture(backend):
    """MoE inlined: one ExpertAdd per expert, over every expert's output, equals each token's sum
    over only its selected experts."""
    from mnngpu.ops.op_table import EXPERT_ADD
    from mnngpu.ops.routing import ExpertAddParam

    rng = np.random.default_rng(24)
    tokens, width, experts, k = 5, 40, 4, 2
    outputs = [stored(backend, rng.normal(0, 1, (tokens, width))) for _ in range(experts)]
    selected = np.array([rng.permutation(experts)[:k] for _ in range(tokens)], dtype=np.int32).reshape(1, tokens, k)
    weights = stored(backend, rng.uniform(0.1, 1, (1, tokens, k)))
    acc = None
    for expert, y in enumerate(outputs):
        node = Node(EXPERT_ADD, f"e{expert}", ExpertAddParam(expert, k))
        arrays = [y, weights, selected] + ([] if acc is None else [acc])
        acc = run(backend, node, arrays, declined_by=ROUTING_DECLINED_BY)
    close(backend, acc, reference.expert_mixture(outputs, weights, selected), 1e-5)
