"""Every op of the Vulkan backend, alone, through the Backend interface, against tests/reference.py
and plain numpy indexing. Skipped where no Vulkan driver is installed (CI runs lavapipe)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from mnngpu.backend import BackendConfig, Node, Tensor
from mnngpu.errors import InputError
from mnngpu.format import params as P
from mnngpu.format.quant import QuantizedLinear
from mnngpu.runtime import fusion, shapes
from mnngpu.runtime.kv import KVMeta
from tests import reference
from tests.conftest import backend_or_skip

RTOL = 2e-5


@pytest.fixture(scope="module")
def vulkan():
    backend_or_skip("vulkan")
    from mnngpu.backends.vulkan import VulkanBackend

    return VulkanBackend


def make_backend(vulkan, precision: str = "high", **attrs):
    backend = vulkan(BackendConfig(precision=precision), KVMeta())
    for name, value in attrs.items():
        setattr(backend, name, value)
    return backend


class OneOp:
    """One op resized once on a backend (its commands recorded), then run on fresh inputs."""

    def __init__(self, backend, node: Node, arrays: list[np.ndarray], host: tuple[int, ...] = ()):
        self.backend = backend
        self.node = node
        self.inputs = [Tensor(np.shape(a), np.asarray(a).dtype, f"in{i}", host=np.asarray(a) if i in host else None)
                       for i, a in enumerate(arrays)]
        self.outputs = [Tensor(tuple(s), np.dtype(d), "out") for s, d in shapes.infer(node, self.inputs)]
        if node.weights:
            backend.rearrange(node)
        backend.onResizeBegin()
        self.execution = backend.onCreate(self.inputs, self.outputs, node)
        assert self.execution is not None, f"{node.type} declined"
        for tensor, array in zip(self.inputs, arrays):
            backend.upload(tensor, np.asarray(array))
        for tensor in self.outputs:
            backend.alloc(tensor)
        self.execution.onResize(self.inputs, self.outputs)
        backend.onResizeEnd()

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        return self.every_output(*arrays)[0]

    def every_output(self, *arrays: np.ndarray) -> list[np.ndarray]:
        for tensor, array in zip(self.inputs, arrays):
            if tensor.host is None:
                self.backend.upload(tensor, np.asarray(array))
        self.execution.onExecute(self.inputs, self.outputs)
        self.backend.finish()
        return [self.backend.download(t) for t in self.outputs]


def run(backend, node, arrays, host=()):
    return OneOp(backend, node, arrays, host)(*arrays)


def close(got, want, rtol=RTOL):
    reference.assert_close(got, want, rtol)


# ---- Convolution (linear) ---------------------------------------------------------------------

def quantized_linear(rng, oc: int, ic: int, bits: int, block: int, bias: bool) -> tuple[QuantizedLinear, np.ndarray]:
    """A QuantizedLinear laid out as format/quant.py decodes one, and its float64 weight."""
    levels, scales, zeros = reference.random_levels(rng, oc, ic, bits, block)
    codes = reference.pack_high_nibble_first(levels) if bits == 4 else levels
    weight = QuantizedLinear(oc, ic, bits, block, False, codes, scales, zeros,
                             rng.normal(0, 1, oc).astype(np.float32) if bias else None)
    dense = levels.astype(np.float64) * np.repeat(scales, block, 1) + np.repeat(zeros, block, 1)
    return weight, dense


def conv_node(weight: QuantizedLinear) -> Node:
    common = P.Convolution2DCommon(inputCount=weight.ic, outputCount=weight.oc)
    return Node("Convolution", "fc", P.Convolution2D(common=common), {"weight": weight})


def linear_reference(x: np.ndarray, dense: np.ndarray, bias) -> np.ndarray:
    y = x.astype(np.float64) @ dense.T
    return y if bias is None else y + bias


@pytest.mark.parametrize("bits, block, kind", [(4, 32, "q4"), (4, 96, "q4"), (8, 48, "q8"), (8, 96, "q8"),
                                               (4, 4, "dense"), (3, 8, "q8"), (4, 6, "dense")])
@pytest.mark.parametrize("rows", [1, 13])
def test_quantized_linear(vulkan, bits, block, kind, rows):
    rng = np.random.default_rng(bits * 100 + block + rows)
    weight, dense = quantized_linear(rng, oc=72, ic=96, bits=bits, block=block, bias=rows == 13)
    bias = weight.bias
    backend = make_backend(vulkan)
    node = conv_node(weight)
    x = rng.normal(0, 1, (rows, 96, 1, 1)).astype(np.float32)
    got = run(backend, node, [x])
    assert node.weights["vulkan"].kind.startswith(kind) and "weight" not in node.weights
    close(got.reshape(rows, 72), linear_reference(x.reshape(rows, 96), dense, bias), 1e-5)


def test_quantized_linear_matches_shared_reference(vulkan):
    """The same layer against tests/reference.linear (int8, per-row blocks)."""
    rng = np.random.default_rng(5)
    weight, _ = quantized_linear(rng, oc=40, ic=64, bits=8, block=64, bias=True)
    x = rng.normal(0, 1, (3, 64, 1, 1)).astype(np.float32)
    want = reference.linear(x.reshape(3, 64), weight.codes, weight.scales, weight.zeros, 64, weight.bias)
    got = run(make_backend(vulkan), conv_node(weight), [x])
    close(got.reshape(3, 40), want, 1e-5)


@pytest.mark.parametrize("precision, dtype, rtol", [("high", np.float32, 1e-5), ("low", np.float16, 2e-3)])
@pytest.mark.parametrize("rows", [1, 9])
def test_float_linear(vulkan, precision, dtype, rtol, rows):
    rng = np.random.default_rng(rows)
    w = rng.normal(0, 0.2, (24, 40)).astype(dtype)
    weight = QuantizedLinear(24, 40, 16 if dtype == np.float16 else 32, 40, False, np.zeros((24, 0), np.uint8),
                             np.zeros((24, 0), np.float32), np.zeros((24, 0), np.float32), None, float_weight=w)
    backend = make_backend(vulkan, precision)
    x = rng.normal(0, 1, (rows, 40, 1, 1)).astype(np.float32)
    got = run(backend, conv_node(weight), [x])
    close(got.reshape(rows, 24), x.reshape(rows, 40).astype(np.float64) @ w.astype(np.float64).T, rtol)


@pytest.mark.parametrize("rows", [1, 11])
def test_linear_split_across_bindings(vulkan, rows):
    """A layer larger than maxStorageBufferRange runs as parts of output rows, one binding each."""
    rng = np.random.default_rng(7)
    weight, dense = quantized_linear(rng, oc=250, ic=256, bits=4, block=32, bias=True)
    backend = make_backend(vulkan, max_binding_bytes=128 * 100)   # 100 rows of 128 code bytes per part
    node = conv_node(weight)
    x = rng.normal(0, 1, (rows, 256, 1, 1)).astype(np.float32)
    got = run(backend, node, [x])
    assert [p.rows for p in node.weights["vulkan"].parts] == [100, 100, 50]
    close(got.reshape(rows, 250), linear_reference(x.reshape(rows, 256), dense, weight.bias), 1e-5)


def fused_linear(backend, kind: str, weights: list[QuantizedLinear]) -> Node:
    """runtime/fusion.py's LinearGroup / GatedLinear node over Convolutions packed for `backend`."""
    members = [conv_node(w) for w in weights]
    for member in members:
        backend.rearrange(member)
    return Node(kind, "fused", fusion.FusedLinearParam(members))


@pytest.mark.parametrize("rows", [1, 9])
def test_linear_group_gives_each_members_output(vulkan, rows):
    rng = np.random.default_rng(3 + rows)
    layers = [quantized_linear(rng, oc, 128, 4, 64, bias=True) for oc in (96, 32, 30)]
    x = rng.normal(0, 1, (rows, 128, 1, 1)).astype(np.float32)
    backend = make_backend(vulkan)
    outs = OneOp(backend, fused_linear(backend, "LinearGroup", [w for w, _ in layers]), [x]).every_output(x)
    for got, (weight, dense) in zip(outs, layers, strict=True):
        close(got.reshape(rows, -1), linear_reference(x.reshape(rows, 128), dense, weight.bias), 1e-5)


@pytest.mark.parametrize("bits, block", [(4, 64), (8, 32), (4, 4)])
@pytest.mark.parametrize("rows", [1, 9])
def test_gated_linear_is_up_times_silu_gate(vulkan, bits, block, rows):
    rng = np.random.default_rng(5 + rows + bits)
    (gate, gate_w), (up, up_w) = (quantized_linear(rng, 200, 128, bits, block, bias=True) for _ in range(2))
    x = rng.normal(0, 1, (rows, 128, 1, 1)).astype(np.float32)
    backend = make_backend(vulkan, max_binding_bytes=8000)    # the layers split into parts, alike
    node = fused_linear(backend, "GatedLinear", [gate, up])
    assert len(node.param.members[0].weights["vulkan"].parts) >= 2
    got = run(backend, node, [x])
    g = linear_reference(x.reshape(rows, 128), gate_w, gate.bias)
    u = linear_reference(x.reshape(rows, 128), up_w, up.bias)
    close(got.reshape(rows, 200), reference.silu_mul(u, g), 1e-5)


# ---- LayerNorm ------------------------------------------------------------------------------------

@pytest.mark.parametrize("rms, with_gamma, with_beta, shape, axes", [
    (True, True, False, (1, 5, 96), 1),
    (True, True, False, (1, 3, 4, 32), 1),      # qwen3's q/k norm over head_dim
    (False, True, True, (2, 7, 130), 1),
    (True, False, False, (3, 4, 16), 2),
])
def test_layer_norm(vulkan, rms, with_gamma, with_beta, shape, axes):
    rng = np.random.default_rng(len(shape) + axes)
    x = rng.normal(0.5, 2, shape).astype(np.float32)
    n = int(np.prod(shape[-axes:]))
    gamma = rng.normal(1, 0.1, n).astype(np.float32) if with_gamma else None
    beta = rng.normal(0, 0.1, n).astype(np.float32) if with_beta else None
    param = P.LayerNorm(axis=list(range(-axes, 0)), epsilon=1e-5, useRMSNorm=rms)
    node = Node("LayerNorm", "norm", param, {"gamma": gamma, "beta": beta})
    got = run(make_backend(vulkan), node, [x])
    rows = x.reshape(-1, n)
    if rms:
        want = reference.rms_norm(rows, gamma if gamma is not None else np.ones(n), 1e-5)
    else:
        want = reference.layer_norm(rows, gamma, beta, 1e-5)
    close(got.reshape(-1, n), want, 1e-5)


# ---- Attention ------------------------------------------------------------------------------------

def attention_node(layer: int = 0, scale: float = 0.0, output_c4: bool = False) -> Node:
    return Node("Attention", f"attn{layer}", P.AttentionParam(layer_index=layer, attnScale=scale, output_c4=output_c4))


def attention_inputs(rng, seq, heads, kv_heads, dim):
    q = rng.normal(0, 1, (1, seq, heads, dim)).astype(np.float32)
    k = rng.normal(0, 1, (1, seq, kv_heads, dim)).astype(np.float32)
    v = rng.normal(0, 1, (seq, kv_heads * dim, 1, 1)).astype(np.float32)
    return [q, k, v, np.zeros((1, 1, 1, 1), np.float32)]


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
@pytest.mark.parametrize("precision, rtol", [("high", 1e-5), ("low", 3e-3)])
@pytest.mark.parametrize("heads, kv_heads, dim, scale, config_scale, output_c4",
                         [(4, 2, 32, 0.0, 0.0, True), (2, 2, 16, 0.3, 0.5, False), (6, 1, 64, 0.0, 0.0, False),
                          (2, 1, 18, 0.0, 0.0, False), (2, 2, 16, 0.0, 0.45, False)])
def test_attention_prefill_then_decode(vulkan, variant, precision, rtol, heads, kv_heads, dim, scale, config_scale,
                                       output_c4):
    """A padded prefill (8 rows, 5 real) then two decode steps: the cache holds exactly the real
    tokens, the padded rows are overwritten, and each row sees its causal past. Both kernel
    families (head_dim 18 takes the workgroup kernel in either)."""
    rng = np.random.default_rng(heads * dim)
    backend = make_backend(vulkan, precision, variant=variant)
    meta = backend.kv_meta
    meta.attn_scale = config_scale  # the config's attn_scale, used where the op records none
    node = attention_node(scale=scale, output_c4=output_c4)
    prefill_in = attention_inputs(rng, 8, heads, kv_heads, dim)
    prefill = OneOp(backend, node, prefill_in)
    decode_in = attention_inputs(rng, 1, heads, kv_heads, dim)
    decode = OneOp(backend, node, decode_in)
    scale = scale or config_scale or 1 / np.sqrt(dim)
    keys, values = [], []
    meta.add = 5
    got = prefill(*prefill_in)
    meta.sync()
    keys.append(prefill_in[1][0, :5])
    values.append(prefill_in[2].reshape(8, kv_heads, dim)[:5])
    want = reference.causal_attention(prefill_in[0][0], prefill_in[1][0], prefill_in[2].reshape(8, kv_heads, dim), 0,
                                      scale)
    assert got.shape == ((8, heads * dim, 1, 1) if output_c4 else (1, 8, heads * dim))
    close(got.reshape(8, heads, dim)[:5], want[:5], rtol)
    for _ in range(2):
        step = attention_inputs(rng, 1, heads, kv_heads, dim)
        meta.add = 1
        got = decode(*step)
        meta.sync()
        keys.append(step[1][0])
        values.append(step[2].reshape(1, kv_heads, dim))
        past = meta.previous - 1
        want = reference.causal_attention(step[0][0], np.concatenate(keys), np.concatenate(values), past, scale)
        close(got.reshape(1, heads, dim), want, rtol)


def test_attention_reserve_keeps_spans(vulkan):
    """KVMeta.reserve: of the 3 removed tokens only the middle one stays, moved behind the kept ones."""
    rng = np.random.default_rng(3)
    backend = make_backend(vulkan)
    meta = backend.kv_meta
    node = attention_node()
    first = attention_inputs(rng, 6, 2, 1, 16)
    meta.add = 6
    OneOp(backend, node, first)(*first)
    meta.sync()
    meta.remove, meta.reserve = 3, [(1, 1)]
    step = attention_inputs(rng, 1, 2, 1, 16)
    meta.add = 1
    got = OneOp(backend, node, step)(*step)
    kept = [0, 1, 2, 4]
    keys = np.concatenate([first[1][0, kept], step[1][0]])
    values = np.concatenate([first[2].reshape(6, 1, 16)[kept], step[2].reshape(1, 1, 16)])
    want = reference.causal_attention(step[0][0], keys, values, 4, 1 / 4)
    close(got.reshape(1, 2, 16), want, 1e-5)


def test_attention_beyond_the_cache_is_an_input_error(vulkan):
    backend = make_backend(vulkan, max_tokens=4)   # capacity 4 + one prefill chunk
    backend.kv_meta.previous = backend.max_tokens + 100
    inputs = attention_inputs(np.random.default_rng(0), 1, 2, 1, 16)
    with pytest.raises(InputError, match="max_all_tokens"):
        OneOp(backend, attention_node(), inputs)(*inputs)


# ---- RoPE: the fused rotate-half against numpy ----

def run_graph(backend, ops, constants, arrays: list[np.ndarray], output: int):
    """The ops fused for `backend` as static_module does, resized and run in a Pipeline."""
    from mnngpu.backends.cpu import CPUBackend
    from mnngpu.runtime.pipeline import Pipeline

    fused = fusion.fuse(ops, set(backend.executions), graph_outputs={output})
    tensors: list[Tensor | None] = [None] * (output + 1)
    pipeline = Pipeline(fused, backend, CPUBackend(BackendConfig(precision="high", thread_num=1), backend.kv_meta))
    for i, array in enumerate(arrays):
        tensors[i] = Tensor(array.shape, array.dtype, f"in{i}")
        pipeline.bind_input(tensors[i])
    for i, value in constants.items():
        tensors[i] = Tensor(value.shape, value.dtype, f"c{i}", host=value)
    pipeline.resize(tensors)
    for i, array in enumerate(arrays):
        backend.upload(tensors[i], array)
    pipeline.run()
    return fused, pipeline, pipeline.backend_of(tensors[output]).download(tensors[output])


@pytest.mark.parametrize("split, cos_shape", [(16, (1, 5, 1, 32)), (12, (5, 1, 32)), (16, (1, 5, 3, 32))])
def test_rope_is_one_dispatch(vulkan, split, cos_shape):
    rng = np.random.default_rng(13)
    x = rng.normal(0, 1, (1, 5, 3, 32)).astype(np.float32)
    cos, sin = (rng.normal(0, 1, cos_shape).astype(np.float32) for _ in range(2))
    backend = make_backend(vulkan)
    fused, pipeline, got = run_graph(backend, *reference.rotate_half_graph(split, axis=3), [x, cos, sin], 17)
    assert [op.node.type for op in fused] == ["RoPE"] and pipeline.backend_of(pipeline.steps[0].outputs[0]) is backend
    rotated = np.concatenate([-x[..., split:], x[..., :split]], axis=-1)
    close(got, x.astype(np.float64) * cos + rotated * sin)


def test_rope_that_is_no_rotate_half_runs_on_the_cpu_backup(vulkan):
    """Slices along another axis: the fused node is declined, and the CPU backup evaluates the ops."""
    rng = np.random.default_rng(14)
    x = rng.normal(0, 1, (1, 4, 4, 4)).astype(np.float32)
    cos, sin = (rng.normal(0, 1, (1, 4, 4, 4)).astype(np.float32) for _ in range(2))
    backend = make_backend(vulkan)
    ops, constants = reference.rotate_half_graph(2, axis=2)
    ops[4].node.param.axis = 2
    fused, pipeline, got = run_graph(backend, ops, constants, [x, cos, sin], 17)
    assert [op.node.type for op in fused] == ["RoPE"] and pipeline.backend_of(pipeline.steps[-1].outputs[0]) is not backend
    rotated = np.concatenate([-x[:, :, 2:], x[:, :, :2]], axis=2)
    close(got, x.astype(np.float64) * cos + rotated * sin)


# ---- elementwise ----------------------------------------------------------------------------------

def positive_pair(rng, shape_a, shape_b):
    return rng.uniform(0.5, 3, shape_a).astype(np.float32), rng.uniform(0.5, 3, shape_b).astype(np.float32)


@pytest.mark.parametrize("op", sorted(reference.BINARY))
def test_binary_broadcasts(vulkan, op):
    rng = np.random.default_rng(len(op))
    a, b = positive_pair(rng, (2, 3, 4, 5), (3, 1, 5))
    a[0, 0, 0, :2] = b[0, 0, :2]            # equal pairs for the comparisons
    node = Node("BinaryOp", op, P.BinaryOp(opType=op))
    backend = make_backend(vulkan)
    close(run(backend, node, [a, b]), reference.BINARY[op](a.astype(np.float64), b.astype(np.float64)), 1e-5)
    close(run(backend, node, [b, a]), reference.BINARY[op](b.astype(np.float64), a.astype(np.float64)), 1e-5)


def test_binary_with_host_constant(vulkan):
    """RoPE's positions x inv_freq: a device tensor times a constant uploaded once."""
    rng = np.random.default_rng(1)
    positions = np.arange(7, dtype=np.float32).reshape(7, 1)
    inv_freq = rng.uniform(0, 1, 16).astype(np.float32)
    got = run(make_backend(vulkan), Node("BinaryOp", "mul", P.BinaryOp(opType="MUL")), [positions, inv_freq], host=(1,))
    close(got, positions * inv_freq.astype(np.float64))


@pytest.mark.parametrize("op, want", [
    ("ADD", lambda a, b: a + b), ("SUB", lambda a, b: a - b), ("MUL", lambda a, b: a * b),
    ("REALDIV", lambda a, b: np.trunc(a / b)), ("FLOORDIV", lambda a, b: np.floor(a / b)),
    ("MOD", lambda a, b: a - np.floor(a / b) * b), ("MAXIMUM", np.maximum), ("MINIMUM", np.minimum),
    ("LESS", lambda a, b: a < b), ("EQUAL", lambda a, b: a == b),
])
def test_int_binary(vulkan, op, want):
    a = np.array([[-7, -3, 0, 4, 9, 13]], dtype=np.int32)
    b = np.array([[2], [-3], [5]], dtype=np.int32)
    got = run(make_backend(vulkan), Node("BinaryOp", op, P.BinaryOp(opType=op)), [a, b])
    assert got.dtype == np.int32
    assert np.array_equal(got, want(a.astype(np.float64), b.astype(np.float64)).astype(np.int32))


UNARY_DOMAIN = {"ACOS": (-0.99, 0.99), "ASIN": (-0.99, 0.99), "LOG": (0.1, 5), "SQRT": (0.1, 5), "RSQRT": (0.1, 5),
                "TAN": (-1.2, 1.2), "RECIPROCAL": (0.2, 4)}


@pytest.mark.parametrize("op", sorted(reference.UNARY))
def test_unary(vulkan, op):
    low, high = UNARY_DOMAIN.get(op, (-4, 4))
    x = np.random.default_rng(len(op)).uniform(low, high, (3, 50)).astype(np.float32)
    x[0, :3] = [low, 0.5 * (low + high), 2.5 if op == "ROUND" else high]
    if op == "ROUND":
        x[1, :4] = [0.5, 1.5, -2.5, 2.4999]    # half to even, like numpy
    got = run(make_backend(vulkan), Node("UnaryOp", op, P.UnaryOp(opType=op)), [x])
    close(got, reference.UNARY[op](x.astype(np.float64)), 2e-6 if op in ("SIN", "COS") else 1e-5)


def test_rope_angles_at_long_positions(vulkan):
    """cos/sin of position x inv_freq up to position 2048 stay within float32 rounding of numpy's."""
    angles = (np.arange(0, 2048, 7, dtype=np.float32)[:, None] * np.float32(0.9)).astype(np.float32)
    for op, func in (("COS", np.cos), ("SIN", np.sin)):
        got = run(make_backend(vulkan), Node("UnaryOp", op, P.UnaryOp(opType=op)), [angles])
        assert np.abs(got - func(angles.astype(np.float64))).max() < 1e-3


def test_cast(vulkan):
    backend = make_backend(vulkan)
    ints = np.array([[-3, 0, 7, 2**20]], dtype=np.int32)
    got = run(backend, Node("Cast", "c", P.CastParam(dstT="DT_FLOAT")), [ints])
    assert got.dtype == np.float32 and np.array_equal(got, ints.astype(np.float64))
    floats = np.array([[-2.7, -0.2, 0.0, 3.9, 1e6]], dtype=np.float32)
    got = run(backend, Node("Cast", "c", P.CastParam(dstT="DT_INT32")), [floats])
    assert got.dtype == np.int32 and np.array_equal(got, np.trunc(floats.astype(np.float64)))


# ---- data movement --------------------------------------------------------------------------------

def test_views_alias_and_keep_values(vulkan):
    x = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    backend = make_backend(vulkan)
    cases = [(Node("Reshape", "r", P.Reshape(dims=[4, 6])), [x], (4, 6)),
             (Node("Squeeze", "s", P.SqueezeParam(squeezeDims=[0])), [x], (2, 3, 4)),
             (Node("Unsqueeze", "u", P.SqueezeParam(squeezeDims=[4])), [x], (1, 2, 3, 4, 1)),
             (Node("ConvertTensor", "c", None), [x], (1, 2, 3, 4))]
    for node, arrays, shape in cases:
        op = OneOp(backend, node, arrays)
        assert op.outputs[0].device is op.inputs[0].device
        assert np.array_equal(op(*arrays), x.reshape(shape))


def onnx_slice(x, starts, ends, axes, steps):
    host = [np.array(v, dtype=np.int32) for v in (starts, ends, axes, steps)]
    return [x, *host], (1, 2, 3, 4)


@pytest.mark.parametrize("starts, ends, axes, steps, index", [
    ([0], [16], [-1], [1], np.s_[..., 0:16]),
    ([16], [32], [3], [1], np.s_[:, :, :, 16:32]),
    ([-1], [-1000], [1], [-2], np.s_[:, ::-2]),
    ([1, 0], [3, 5], [1, 2], [1, 2], np.s_[:, 1:3, 0:5:2]),
])
def test_onnx_slice(vulkan, starts, ends, axes, steps, index):
    x = np.random.default_rng(0).normal(size=(1, 5, 4, 32)).astype(np.float32)
    arrays, host = onnx_slice(x, starts, ends, axes, steps)
    node = Node("StridedSlice", "s", P.StridedSliceParam(fromType=1))
    assert np.array_equal(run(make_backend(vulkan), node, arrays, host), x[index])


@pytest.mark.parametrize("begin, end, strides, masks, index", [
    ([0, -1, 0], [1, 0, 8], [1, 1, 1], {"shrinkAxisMask": 2, "beginMask": 1, "endMask": 1}, np.s_[:, -1, 0:8]),
    ([0, 1], [0, 3], [1, 1], {"ellipsisMask": 1}, np.s_[..., 1:3]),
    ([0, 0, 2], [0, 0, 6], [1, 1, 2], {"newAxisMask": 2, "beginMask": 1, "endMask": 1}, np.s_[:, None, 2:6:2]),
])
def test_tf_strided_slice(vulkan, begin, end, strides, masks, index):
    x = np.random.default_rng(1).normal(size=(3, 4, 8)).astype(np.float32)
    arrays = [x, *(np.array(v, dtype=np.int32) for v in (begin, end, strides))]
    node = Node("StridedSlice", "s", P.StridedSliceParam(fromType=0, **masks))
    assert np.array_equal(run(make_backend(vulkan), node, arrays, (1, 2, 3)), x[index])


@pytest.mark.parametrize("indices, axis", [(np.array(1), 0), (np.array([2, 0, 3, 3]), 1), (np.array([-1, 0]), 2),
                                           (np.array([[0, 1], [1, 0]]), 0)])
def test_gather_with_host_indices(vulkan, indices, axis):
    x = np.random.default_rng(2).normal(size=(2, 4, 3, 5)).astype(np.float32)
    arrays = [x, indices.astype(np.int32), np.array(axis, dtype=np.int32)]
    got = run(make_backend(vulkan), Node("GatherV2", "g", P.GatherV2()), arrays, (1, 2))
    assert np.array_equal(got, np.take(x, indices % x.shape[axis], axis=axis))


def test_gather_with_device_indices_is_declined(vulkan):
    backend = make_backend(vulkan)
    x = Tensor((4, 3), np.dtype(np.float32))
    indices = Tensor((2,), np.dtype(np.int32))
    assert backend.onCreate([x, indices], [Tensor((2, 3), np.dtype(np.float32))], Node("GatherV2", "g", None)) is None


@pytest.mark.parametrize("axis, shapes_in, dtype", [(0, [(1, 3, 16), (2, 3, 16)], np.float32),
                                                    (-1, [(2, 3, 16), (2, 3, 16), (2, 3, 4)], np.float32),
                                                    (1, [(2, 1, 4), (2, 5, 4)], np.int32)])
def test_concat(vulkan, axis, shapes_in, dtype):
    rng = np.random.default_rng(3)
    arrays = [rng.integers(-50, 50, s).astype(dtype) for s in shapes_in]
    got = run(make_backend(vulkan), Node("Concat", "c", P.Axis(axis=axis)), arrays)
    assert got.dtype == dtype and np.array_equal(got, np.concatenate(arrays, axis=axis))


# ---- the device layer -----------------------------------------------------------------------------

def test_recorded_commands_replay_on_new_inputs(vulkan):
    rng = np.random.default_rng(4)
    a, b = positive_pair(rng, (3, 8), (3, 8))
    op = OneOp(make_backend(vulkan), Node("BinaryOp", "add", P.BinaryOp(opType="ADD")), [a, b])
    for _ in range(3):
        a, b = positive_pair(rng, (3, 8), (3, 8))
        close(op(a, b), a.astype(np.float64) + b)


def test_staged_memory_path(vulkan):
    """Device memory the host cannot map (discrete GPUs) goes through staging copies."""
    from mnngpu.backends.vulkan.memory import MemoryArena

    backend = make_backend(vulkan)
    backend.arena = MemoryArena(backend.device, staged=True)
    rng = np.random.default_rng(6)
    weight, dense = quantized_linear(rng, oc=20, ic=32, bits=4, block=32, bias=True)
    x = rng.normal(0, 1, (2, 32, 1, 1)).astype(np.float32)
    got = run(backend, conv_node(weight), [x])
    assert node_buffers_unmapped(backend)
    close(got.reshape(2, 20), linear_reference(x.reshape(2, 32), dense, weight.bias), 1e-5)


def node_buffers_unmapped(backend) -> bool:
    probe = backend.arena.allocate(64)
    return probe.view is None


def test_declined_op_splits_the_recording(vulkan):
    """An op the backend declines runs on the CPU backup between two submits of recorded work."""
    from mnngpu.backends.cpu import CPUBackend
    from mnngpu.runtime.pipeline import GraphOp, Pipeline

    backend = make_backend(vulkan)
    cpu = CPUBackend(BackendConfig(precision="high", thread_num=1), backend.kv_meta)
    ops = [GraphOp(Node("BinaryOp", "add", P.BinaryOp(opType="ADD")), [0, 1], [2]),
           GraphOp(Node("UnaryOp", "neg", P.UnaryOp(opType="NEG")), [2], [3]),   # int unary: declined
           GraphOp(Node("BinaryOp", "mul", P.BinaryOp(opType="MUL")), [3, 1], [4])]
    a = np.array([[1, -2, 3]], dtype=np.int32)
    b = np.array([[4, 5, -6]], dtype=np.int32)
    tensors = [Tensor(a.shape, a.dtype, "a"), Tensor(b.shape, b.dtype, "b"), None, None, None]
    pipeline = Pipeline(ops, backend, cpu)
    for t in tensors[:2]:
        pipeline.bind_input(t)
    pipeline.resize(tensors)
    assert [pipeline.backend_of(t) for t in tensors[2:]] == [backend, cpu, backend]
    for _ in range(2):
        backend.upload(tensors[0], a)
        backend.upload(tensors[1], b)
        pipeline.run()
        assert np.array_equal(backend.download(tensors[4]), -(a + b) * b)
        a, b = b, a


@pytest.mark.parametrize("breakage, expected", [
    ("import sys; sys.modules['vulkan'] = None", "pip install 'mnngpu[vulkan]'"),
    (("import os; os.environ['VK_ICD_FILENAMES'] = '/nonexistent/icd.json'; "
     "os.environ['VK_DRIVER_FILES'] = '/nonexistent/icd.json'"), "mesa-vulkan-drivers"),
])
def test_missing_binding_or_driver_is_one_clear_error(vulkan, breakage, expected):
    script = (f"{breakage}\n"
              "from mnngpu.backend import BackendConfig, create_backend\n"
              "from mnngpu.errors import BackendUnavailableError\n"
              "try:\n    create_backend('vulkan', BackendConfig())\n"
              "except BackendUnavailableError as exc:\n    print('UNAVAILABLE', exc)\n")
    out = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                         timeout=120).stdout
    assert out.startswith("UNAVAILABLE") and expected in out, out


def test_one_recording_per_module_and_only_inputs_and_logits_move(vulkan, monkeypatch):
    """On a fixture: each pool module is recorded once, every op runs on the device, and a decode
    step writes only the embedding row, the position, the mask and the KV length, submits once
    and reads only the logits."""
    from mnngpu import llm as mnngpu_llm
    from mnngpu.backends.vulkan import memory, program
    from tests.conftest import FIXTURES
    from tests.conftest import reference as fixture_reference

    name = "qwen3_int4_b64"
    ref, _ = fixture_reference(name)
    model = mnngpu_llm.create(FIXTURES / name)
    model.set_config({"backend_type": "vulkan", "precision": "high"})
    model.load()
    recorded = []
    record = program.Segment.record
    monkeypatch.setattr(program.Segment, "record", lambda self, *a: (recorded.append(self), record(self, *a))[1])
    for prompt in ref["prompts"]:   # one and two prefill chunks
        model.reset()
        tokens = [int(np.asarray(model.forward(prompt["ids"]))[0, -1].argmax())]
        tokens.append(int(np.asarray(model.forward([tokens[-1]]))[0, -1].argmax()))
        assert tokens == prompt["greedy"][:2]
    assert len(recorded) == 2
    for module in model.pool.modules.values():
        for pipeline, _ in module.session.pipelines.values():
            assert all(pipeline.backend_of(t) is pipeline.backend for s in pipeline.steps for t in s.outputs)

    backend = model.runtime.backend()
    moved = {"up": [], "down": [], "submits": 0}
    write, download, submit = memory.DeviceTensor.write, backend.download, backend.device.submit
    monkeypatch.setattr(memory.DeviceTensor, "write", lambda self, v: (moved["up"].append(self.nbytes), write(self, v))[1])
    monkeypatch.setattr(backend, "download", lambda t: (moved["down"].append(t.nbytes), download(t))[1])
    monkeypatch.setattr(backend.device, "submit", lambda cbs: (moved.__setitem__("submits", moved["submits"] + 1),
                                                               submit(cbs))[1])
    logits = np.asarray(model.forward([5]))
    hidden = model.config.hidden_size
    step_writes = [16] * len(backend.kv_caches)          # the KV length, written by each layer's Attention
    assert sorted(moved["up"]) == sorted([hidden * 4, 4, 4, *step_writes])
    assert moved["down"] == [logits.size * 4]
    assert moved["submits"] == 1
