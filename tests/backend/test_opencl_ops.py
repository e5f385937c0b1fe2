"""Every op of the OpenCL backend, alone, through the Backend interface, against tests/reference.py
or plain numpy indexing. Each runs with both kernel families (cpu: registers only; gpu:
local-memory tiles) and both storages (fp32; fp16, which PoCL runs through the core
vload_half/vstore_half even without cl_khr_fp16). Then whole-model checks of what the
fixed-shape design promises: one resize per module, per-step transfers, the gpu kernels and
fp16 on a real fixture."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("pyopencl")

from mnngpu.backend import BackendConfig, Node, Tensor
from mnngpu.errors import BackendUnavailableError
from mnngpu.format.quant import QuantizedLinear
from mnngpu.runtime import shapes
from mnngpu.runtime.kv import KVMeta
from tests import reference
from tests.conftest import FIXTURES
from tests.conftest import reference as fixture_reference

KINDS = [("cpu", False), ("gpu", False), ("cpu", True), ("gpu", True)]


def make_backend(variant: str = "cpu", half: bool = False, precision: str = "high"):
    from mnngpu.backends.opencl import OpenCLBackend

    try:
        return OpenCLBackend(BackendConfig(precision=precision), KVMeta(), variant=variant, half_storage=half)
    except BackendUnavailableError as exc:
        pytest.skip(f"opencl unavailable: {exc}")


@pytest.fixture(params=KINDS, ids=[f"{v}-{'fp16' if h else 'fp32'}" for v, h in KINDS])
def backend(request):
    return make_backend(*request.param)


def close(backend, got: np.ndarray, want: np.ndarray, fp32: float = 1e-5, fp16: float = 1e-2) -> None:
    """Within a tolerance relative to the result's scale (fp16 storage rounds at 1 part in 2048)."""
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    scale = max(float(np.abs(want).max()), 1e-6)
    assert np.abs(got - want).max() <= (fp16 if backend.half else fp32) * scale


def halfable(array: np.ndarray) -> np.ndarray:
    """float32 values that fp16 storage holds exactly, so storage rounding never flips a comparison."""
    return np.asarray(array, dtype=np.float16).astype(np.float32)


class Host:
    """An input known on the host (a constant or a folded shape value)."""

    def __init__(self, array):
        self.array = np.asarray(array)


def run(backend, node: Node, inputs: list, steps: int = 1) -> list[np.ndarray]:
    """Create, resize and execute one op as the Pipeline does; returns its outputs."""
    tensors = []
    for value in inputs:
        array = value.array if isinstance(value, Host) else np.asarray(value)
        tensor = Tensor(array.shape, array.dtype, host=array if isinstance(value, Host) else None)
        backend.upload(tensor, array)
        tensors.append(tensor)
    outputs = [Tensor(tuple(shape), np.dtype(dtype)) for shape, dtype in shapes.infer(node, tensors)]
    execution = backend.onCreate(tensors, outputs, node)
    assert execution is not None, f"{node.type} declined"
    backend.onResizeBegin()
    for tensor in outputs:
        backend.alloc(tensor)
    execution.onResize(tensors, outputs)
    backend.onResizeEnd()
    for _ in range(steps):
        execution.onExecute(tensors, outputs)
    backend.finish()
    return [backend.download(t) for t in outputs]


rng = np.random.default_rng(7)


# ---- Convolution (linear) ---------------------------------------------------------------------------------------

def linear_node(weight: QuantizedLinear) -> Node:
    common = SimpleNamespace(inputCount=weight.ic, outputCount=weight.oc)
    return Node("Convolution", "linear", SimpleNamespace(common=common), {"weight": weight})


def quantized(oc: int, ic: int, bits: int, block: int, bias: bool):
    codes = rng.integers(0, 1 << bits, (oc, ic), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, (oc, ic // block)).astype(np.float32)
    zeros = (-(1 << (bits - 1)) * scales).astype(np.float32)
    stored = (codes[:, 0::2] << 4 | codes[:, 1::2]).astype(np.uint8) if bits == 4 else codes  # high nibble first
    b = rng.standard_normal(oc).astype(np.float32) if bias else None
    return QuantizedLinear(oc, ic, bits, block, True, stored, scales, zeros, b), codes


LINEAR_CASES = {  # name: (oc, ic, bits, block)
    "int4-block64": (20, 128, 4, 64),        # the grouped-nibble layout, vector kernels
    "int4-block16": (6, 48, 4, 16),          # a block the vector kernels cannot take: generic kernel
    "int8-channelwise": (13, 96, 8, 96),
    "int3": (9, 64, 3, 32),                  # other widths: one code a byte
}


@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("case", list(LINEAR_CASES))
def test_quantized_linear(backend, case, rows):
    oc, ic, bits, block = LINEAR_CASES[case]
    weight, codes = quantized(oc, ic, bits, block, bias=case != "int3")
    x = halfable(rng.standard_normal((rows, ic, 1, 1)))
    node = linear_node(weight)
    backend.rearrange(node)
    assert "weight" not in node.weights  # the raw arrays are dropped once packed
    (y,) = run(backend, node, [x])
    want = reference.linear(x.reshape(rows, ic), codes, weight.scales, weight.zeros, block, weight.bias)
    close(backend, y.reshape(rows, oc), want)


@pytest.mark.parametrize("ic", [64, 40])
def test_float_linear(backend, ic):
    oc, rows = 10, 5
    dense = halfable(rng.standard_normal((oc, ic)))
    empty = np.zeros((oc, 0), dtype=np.float32)
    weight = QuantizedLinear(oc, ic, 32, ic, True, np.zeros((oc, 0), np.uint8), empty, empty, None, float_weight=dense)
    x = halfable(rng.standard_normal((rows, ic, 1, 1)))
    node = linear_node(weight)
    backend.rearrange(node)
    (y,) = run(backend, node, [x])
    close(backend, y.reshape(rows, oc), x.reshape(rows, ic).astype(np.float64) @ dense.T)


# ---- LayerNorm -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rms,width,has_beta", [(True, 64, False), (False, 30, True), (True, 7, False)])
def test_layer_norm(backend, rms, width, has_beta):
    x = halfable(rng.standard_normal((2, 3, width)) * 3)
    gamma = rng.standard_normal(width).astype(np.float32)
    beta = rng.standard_normal(width).astype(np.float32) if has_beta else None
    node = Node("LayerNorm", "norm", SimpleNamespace(axis=[-1], epsilon=1e-5, useRMSNorm=rms),
                {"gamma": gamma, "beta": beta})
    backend.rearrange(node)
    (y,) = run(backend, node, [x])
    rows = x.reshape(-1, width)
    want = reference.rms_norm(rows, gamma, 1e-5) if rms else reference.layer_norm(rows, gamma, beta, 1e-5)
    close(backend, y.reshape(-1, width), want)


def test_layer_norm_over_two_axes_without_gamma(backend):
    x = halfable(rng.standard_normal((1, 3, 4, 8)))
    node = Node("LayerNorm", "norm", SimpleNamespace(axis=[-2, -1], epsilon=1e-6, useRMSNorm=True), {})
    backend.rearrange(node)
    (y,) = run(backend, node, [x])
    close(backend, y.reshape(3, 32), reference.rms_norm(x.reshape(3, 32), np.ones(32), 1e-6))


# ---- Attention -------------------------------------------------------------------------------------------------

def attention_node(output_c4: bool) -> Node:
    return Node("Attention", "attention", SimpleNamespace(kv_cache=True, layer_index=0, output_c4=output_c4,
                                                          attnScale=0.0))


class AttentionModule:
    """One Attention op resized for `seq` rows, replayed step after step as a fixed-shape module is."""

    def __init__(self, backend, seq: int, heads: int, kv_heads: int, dim: int, output_c4: bool):
        self.backend, self.shape = backend, (seq, heads, kv_heads, dim)
        self.inputs = [Tensor((1, seq, heads, dim), np.float32), Tensor((1, seq, kv_heads, dim), np.float32),
                       Tensor((seq, kv_heads * dim, 1, 1), np.float32), Tensor((1, 1, 1, 1), np.float32)]
        node = attention_node(output_c4)
        (shape, dtype), = shapes.infer(node, self.inputs)
        self.outputs = [Tensor(shape, dtype)]
        self.execution = backend.onCreate(self.inputs, self.outputs, node)
        self.execution.onResize(self.inputs, self.outputs)

    def step(self, q, k, v) -> np.ndarray:
        for tensor, value in zip(self.inputs, (q, k, v, np.zeros((1, 1, 1, 1), np.float32))):
            self.backend.upload(tensor, value.reshape(tensor.shape))
        self.execution.onExecute(self.inputs, self.outputs)
        self.backend.finish()
        seq, heads, _, dim = self.shape
        return self.backend.download(self.outputs[0]).reshape(seq, heads, dim)


@pytest.mark.parametrize("dim,output_c4,config_scale", [(16, True, 0.0), (8, False, 0.0), (6, True, 0.0), (8, False, 0.6)])
def test_attention_padded_prefill_then_decode(backend, dim, output_c4, config_scale):
    heads, kv_heads, real, padded = 4, 2, 5, 8
    meta = backend.kv_meta
    meta.attn_scale = config_scale  # the config's attn_scale: the op records none
    prefill = AttentionModule(backend, padded, heads, kv_heads, dim, output_c4)
    decode = AttentionModule(backend, 1, heads, kv_heads, dim, output_c4)
    total = real + 3
    q = halfable(rng.standard_normal((total, heads, dim)))
    k = halfable(rng.standard_normal((total, kv_heads, dim)))
    v = halfable(rng.standard_normal((total, kv_heads, dim)))
    scale = config_scale or 1.0 / np.sqrt(dim)

    pad = np.zeros((padded - real, 1, 1), np.float32)
    meta.add = real
    out = prefill.step(*(np.concatenate([a[:real], pad + 9.0 * np.ones_like(a[:1])]) for a in (q, k, v)))
    meta.sync()
    close(backend, out[:real], reference.causal_attention(q[:real], k[:real], v[:real], 0, scale))
    for t in range(real, total):  # the padded rows written past the real end are overwritten, never seen
        meta.add = 1
        out = decode.step(q[t:t + 1], k[t:t + 1], v[t:t + 1])
        meta.sync()
        close(backend, out, reference.causal_attention(q[t:t + 1], k[:t + 1], v[:t + 1], t, scale))


def test_attention_keeps_reserved_spans(backend):
    heads, kv_heads, dim, seq = 2, 1, 8, 8
    meta = backend.kv_meta
    prefill = AttentionModule(backend, seq, heads, kv_heads, dim, False)
    decode = AttentionModule(backend, 1, heads, kv_heads, dim, False)
    q, k, v = (halfable(rng.standard_normal((seq + 1, h, dim))) for h in (heads, kv_heads, kv_heads))
    meta.add = seq
    prefill.step(q[:seq], k[:seq], v[:seq])
    meta.sync()
    # MNN's reserve: drop the last 4 tokens but keep 2 of them, those at 4+1 and 4+2.
    meta.remove, meta.reserve, meta.add = 4, [(1, 2)], 1
    kept = [0, 1, 2, 3, 5, 6]
    out = decode.step(q[seq:], k[seq:], v[seq:])
    keys, values = np.concatenate([k[kept], k[seq:]]), np.concatenate([v[kept], v[seq:]])
    close(backend, out, reference.causal_attention(q[seq:], keys, values, len(kept), 1.0 / np.sqrt(dim)))


def test_attention_cache_grows_past_its_capacity(backend):
    """A history longer than the cache was sized for: the cache doubles and the kernels re-bind."""
    from mnngpu.backends.opencl.ops.attention import DeviceKVCache

    heads, kv_heads, dim, steps = 2, 2, 8, 7
    backend.kv_caches[0] = DeviceKVCache(backend, kv_heads, dim, capacity=2)
    decode = AttentionModule(backend, 1, heads, kv_heads, dim, False)
    q, k, v = (halfable(rng.standard_normal((steps, h, dim))) for h in (heads, kv_heads, kv_heads))
    for t in range(steps):
        backend.kv_meta.add = 1
        out = decode.step(q[t:t + 1], k[t:t + 1], v[t:t + 1])
        backend.kv_meta.sync()
        close(backend, out, reference.causal_attention(q[t:t + 1], k[:t + 1], v[:t + 1], t, 1.0 / np.sqrt(dim)))
    assert backend.kv_caches[0].capacity == 8


# ---- elementwise -----------------------------------------------------------------------------------------------

def binary_inputs(op: str, shape_a, shape_b):
    a = rng.uniform(-3, 3, shape_a)
    b = rng.uniform(-3, 3, shape_b)
    if op in ("REALDIV", "DIV", "FLOORDIV", "MOD", "FLOORMOD"):
        b = np.where(np.abs(b) < 0.5, 1.5, b)
    if op == "POW":
        a = np.abs(a) + 0.1
    if op in ("EQUAL", "NOTEQUAL", "GREATER_EQUAL", "LESS_EQUAL") and shape_a == shape_b:
        b.reshape(-1)[::2] = a.reshape(-1)[::2]
    return halfable(a), halfable(b)


def binary_node(op: str) -> Node:
    return Node("BinaryOp", op, SimpleNamespace(opType=op))


@pytest.mark.parametrize("op", sorted(reference.BINARY))
def test_binary_same_shape(backend, op):
    a, b = binary_inputs(op, (3, 5, 8), (3, 5, 8))
    (y,) = run(backend, binary_node(op), [a, b])
    close(backend, y, reference.BINARY[op](a.astype(np.float64), b.astype(np.float64)), fp16=2e-2)


@pytest.mark.parametrize("op,shape_a,shape_b,host_b", [
    ("MUL", (1, 5, 4, 8), (1, 5, 1, 8), False),     # RoPE: cos/sin over heads
    ("MUL", (5, 1), (16,), True),                   # positions x inv_freq, a constant
    ("ADD", (2, 3), (3,), False),
    ("SUB", (1,), (2, 3, 4), False),
    ("MUL_SILU", (4, 1, 6), (4, 3, 1), False),
])
def test_binary_broadcast(backend, op, shape_a, shape_b, host_b):
    a, b = binary_inputs(op, shape_a, shape_b)
    (y,) = run(backend, binary_node(op), [a, Host(b) if host_b else b])
    close(backend, y, reference.BINARY[op](a.astype(np.float64), b.astype(np.float64)))


UNARY_DOMAINS = {"SQRT": (0.1, 4), "RSQRT": (0.1, 4), "LOG": (0.1, 4), "ASIN": (-0.9, 0.9), "ACOS": (-0.9, 0.9),
                 "RECIPROCAL": (0.5, 3), "TAN": (-1.2, 1.2)}


@pytest.mark.parametrize("op", sorted(reference.UNARY))
def test_unary(backend, op):
    low, high = UNARY_DOMAINS.get(op, (-3, 3))
    x = halfable(rng.uniform(low, high, (4, 33)))
    (y,) = run(backend, Node("UnaryOp", op, SimpleNamespace(opType=op)), [x])
    close(backend, y, reference.UNARY[op](x.astype(np.float64)), fp32=2e-5)


def test_cast_int_to_float_and_back(backend):
    ids = np.array([[0, 7, -3, 2047]], dtype=np.int32)
    (as_float,) = run(backend, Node("Cast", "cast", SimpleNamespace(dstT="DT_FLOAT")), [ids])
    assert as_float.dtype == np.float32 and np.array_equal(as_float, ids.astype(np.float32))
    values = np.array([-2.75, -0.5, 0.5, 3.75, 100.0], dtype=np.float32)
    (as_int,) = run(backend, Node("Cast", "cast", SimpleNamespace(dstT="DT_INT32")), [values])
    assert as_int.dtype == np.int32 and as_int.tolist() == [-2, 0, 0, 3, 100]  # C truncation


def test_int_binary_op_is_left_to_the_cpu(backend):
    a = Tensor((3,), np.dtype(np.int32))
    out = Tensor((3,), np.dtype(np.int32))
    assert backend.onCreate([a, a], [out], binary_node("ADD")) is None


def fused_rope() -> Node:
    """runtime/fusion.py's RoPE node, fused from the rotate-half ops as an export writes them."""
    from mnngpu.runtime.fusion import fuse
    from mnngpu.runtime.pipeline import GraphOp

    def op(node_type, param, inputs, output):
        return GraphOp(Node(node_type, f"{node_type}{output}", param), inputs, [output])

    onnx_slice = SimpleNamespace(fromType=1)
    ops = [op("StridedSlice", onnx_slice, [0, 3, 4, 5, 6], 11), op("StridedSlice", onnx_slice, [0, 7, 8, 5, 6], 12),
           op("UnaryOp", SimpleNamespace(opType="NEG"), [11], 13), op("Concat", SimpleNamespace(axis=-1), [13, 12], 14),
           op("BinaryOp", SimpleNamespace(opType="MUL"), [14, 2], 15),
           op("BinaryOp", SimpleNamespace(opType="MUL"), [0, 1], 16),
           op("BinaryOp", SimpleNamespace(opType="ADD"), [16, 15], 17)]
    (fused,) = fuse(ops, {"RoPE"}, {17})
    assert fused.node.type == "RoPE"
    return fused.node


@pytest.mark.parametrize("shared_rows", [True, False])
def test_fused_rope(backend, shared_rows):
    """One kernel when cos/sin are one row per position; else the ops as exported, each on the device."""
    seq, heads, dim, split = 3, 4, 8, 4
    x = halfable(rng.standard_normal((1, seq, heads, dim)))
    row_shape = (1, seq, 1, dim) if shared_rows else (1, seq, heads, dim)
    cos, sin = (halfable(rng.uniform(-1, 1, row_shape)) for _ in range(2))
    hi, lo = [[split], [dim], [-1], [1]], [[0], [split], [-1], [1]]  # starts, ends, axes, steps
    node = fused_rope()
    (y,) = run(backend, node, [x, cos, sin, *(Host(np.array(b, dtype=np.int32)) for b in hi + lo)])
    assert (node.param.inputs[3:], len(node.param.ops)) == ([3, 4, 5, 6, 7, 8, 5, 6], 7)
    rotated = np.concatenate([-x[..., split:], x[..., :split]], axis=-1)
    close(backend, y, x.astype(np.float64) * cos + rotated * sin.astype(np.float64))


# ---- data movement ---------------------------------------------------------------------------------------------

def test_onnx_slice_with_negative_step(backend):
    x = halfable(rng.standard_normal((2, 9, 6)))
    node = Node("StridedSlice", "slice", SimpleNamespace(fromType=1))
    bounds = [Host(np.array(v, dtype=np.int32)) for v in ([1, -1], [8, -7], [1, 2], [2, -2])]
    (y,) = run(backend, node, [x, *bounds])
    assert np.array_equal(y, x[:, 1:8:2, -1:-7:-2])


@pytest.mark.parametrize("shrink,want", [(0, lambda x: x[:, 2:5, 1:]), (2, lambda x: x[:, 2, 1:])])
def test_tf_strided_slice_with_masks(backend, shrink, want):
    x = halfable(rng.standard_normal((3, 6, 5)))
    param = SimpleNamespace(fromType=0, beginMask=1, endMask=1 | 4, ellipsisMask=0, newAxisMask=0,
                            shrinkAxisMask=shrink)
    bounds = [Host(np.array(v, dtype=np.int32)) for v in ([0, 2, 1], [0, 5, 0], [1, 1, 1])]
    (y,) = run(backend, Node("StridedSlice", "slice", param), [x, *bounds])
    assert np.array_equal(y, want(x))


def test_gather_scalar_index(backend):
    x = halfable(rng.standard_normal((2, 5, 1, 4)))
    node = Node("GatherV2", "gather", None)
    (y,) = run(backend, node, [x, Host(np.array(3, np.int32)), Host(np.array(1, np.int32))])
    assert np.array_equal(y, x[:, 3])


def test_gather_index_list(backend):
    """Indices no strides describe: the explicit-offsets copy."""
    x = halfable(rng.standard_normal((6, 3)))
    (y,) = run(backend, Node("GatherV2", "gather", None),
               [x, Host(np.array([4, 0, 4, -1], np.int32)), Host(np.array(0, np.int32))])
    assert np.array_equal(y, x[[4, 0, 4, 5]])


def test_gather_of_int32(backend):
    ids = np.arange(12, dtype=np.int32).reshape(3, 4)
    (y,) = run(backend, Node("GatherV2", "gather", None), [ids, Host(np.array(2, np.int32)), Host(np.array(1, np.int32))])
    assert y.dtype == np.int32 and np.array_equal(y, ids[:, 2])


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_concat(backend, axis):
    parts = [halfable(rng.standard_normal(shape)) for shape in ((2, 3, 4), (2, 3, 4), (2, 3, 4))]
    constant = Host(parts[1])
    (y,) = run(backend, Node("Concat", "concat", SimpleNamespace(axis=axis)), [parts[0], constant, parts[2]])
    assert np.array_equal(y, np.concatenate(parts, axis=axis))


@pytest.mark.parametrize("op,param,extra,want", [
    ("Reshape", None, [Host(np.array([3, -1], np.int32))], lambda x: x.reshape(3, -1)),
    ("Unsqueeze", SimpleNamespace(squeezeDims=[0]), [], lambda x: x[None]),
    ("Squeeze", SimpleNamespace(squeezeDims=[1]), [], lambda x: x[:, 0]),
    ("ConvertTensor", None, [], lambda x: x),
    ("StridedSlice", SimpleNamespace(fromType=1), [Host(np.array(v, np.int32)) for v in ([0], [8], [-1], [1])],
     lambda x: x),                                   # a slice that takes everything in order
])
def test_views_share_the_input_buffer(backend, op, param, extra, want):
    x = halfable(rng.standard_normal((3, 1, 8)))
    tensor = Tensor(x.shape, np.dtype(np.float32))
    backend.upload(tensor, x)
    inputs = [tensor] + [Tensor(e.array.shape, e.array.dtype, host=e.array) for e in extra]
    (shape, dtype), = shapes.infer(Node(op, op, param), inputs)
    out = Tensor(shape, dtype)
    execution = backend.onCreate(inputs, [out], Node(op, op, param))
    execution.onResize(inputs, [out])
    execution.onExecute(inputs, [out])
    assert out.device is tensor.device
    assert np.array_equal(backend.download(out), want(x))


# ---- the device, precision -------------------------------------------------------------------------------------

def test_no_platform_names_what_to_install(monkeypatch):
    import pyopencl as cl

    from mnngpu.backends.opencl import OpenCLBackend, device

    def no_platform():
        raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    monkeypatch.setattr(device, "_shared", None)
    monkeypatch.setattr(cl, "get_platforms", no_platform)
    with pytest.raises(BackendUnavailableError, match="no OpenCL platform found.*pocl-opencl-icd.*mnngpu\\[opencl\\]"):
        OpenCLBackend(BackendConfig())


def test_platform_without_devices(monkeypatch):
    import pyopencl as cl

    from mnngpu.backends.opencl import OpenCLBackend, device

    class EmptyPlatform:
        name = "Empty"

        def get_devices(self):
            raise cl.RuntimeError("clGetDeviceIDs failed: DEVICE_NOT_FOUND")

    monkeypatch.setattr(device, "_shared", None)
    monkeypatch.setattr(cl, "get_platforms", lambda: [EmptyPlatform()])
    with pytest.raises(BackendUnavailableError, match="no OpenCL device found \\(platforms: Empty\\)"):
        OpenCLBackend(BackendConfig())


def test_low_precision_uses_fp16_only_with_the_extension(caplog):
    from mnngpu.backends.opencl import device

    backend = make_backend(precision="high", half=None)
    assert not backend.half
    device._logged.clear()
    with caplog.at_level(logging.WARNING, logger="mnngpu.opencl"):
        low = [make_backend(precision="low", half=None) for _ in range(2)]
    assert all(b.half == b.device.has_fp16 for b in low)
    warnings = [r for r in caplog.records if "cl_khr_fp16" in r.getMessage()]
    assert len(warnings) == (0 if backend.device.has_fp16 else 1)  # logged once, not per backend


def test_kernel_family_follows_the_device_type():
    backend = make_backend(variant=None)
    assert backend.variant == ("cpu" if backend.device.is_cpu else "gpu")


# ---- whole models ----------------------------------------------------------------------------------------------

def load_fixture(name: str, **overrides):
    from mnngpu import llm as mnngpu_llm

    make_backend()  # skips when there is no OpenCL device
    model = mnngpu_llm.create(FIXTURES / name)
    model.set_config({"backend_type": "opencl", "precision": "high", **overrides})
    model.load()
    return model


def first_logits_and_greedy(model, ids: list[int], steps: int) -> tuple[np.ndarray, list[int]]:
    model.reset()
    first = np.asarray(model.forward(ids))[0, -1]
    tokens = [int(first.argmax())]
    while len(tokens) < steps:
        tokens.append(int(np.asarray(model.forward([tokens[-1]]))[0, -1].argmax()))
    return first, tokens


def test_one_resize_per_module_and_only_inputs_and_logits_move():
    name = "qwen2_int4_b64"
    ref, _ = fixture_reference(name)
    model = load_fixture(name)
    for prompt in ref["prompts"]:  # 3 to 179 tokens: one and two prefill chunks
        assert first_logits_and_greedy(model, prompt["ids"], 3)[1] == prompt["greedy"][:3]
    backend = model.runtime.backend()
    activation_bytes = 0
    for module in model.pool.modules.values():
        assert len(module.session.pipelines) <= 1
        for pipeline, _ in module.session.pipelines.values():
            assert all(pipeline.backend_of(t) is backend for s in pipeline.steps for t in s.outputs)
            activation_bytes += sum(backend.nbytes(t) for s in pipeline.steps for t in s.outputs
                                    if getattr(s.execution, "view_of", None) is None)
    assert backend.pool.nbytes < activation_bytes / 2  # buffers are reused by lifetime

    moved = {"up": [], "down": []}
    write, download = backend._write, backend.download
    backend._write = lambda buffer, data: (moved["up"].append(data.nbytes), write(buffer, data))[1]
    backend.download = lambda tensor: (moved["down"].append(tensor.nbytes), download(tensor))[1]
    logits = np.asarray(model.forward([5]))
    hidden = json.loads((FIXTURES / name / "llm_config.json").read_text())["hidden_size"]
    # the embedding row, the mask, the position, the KV length; the logits
    assert sorted(moved["up"]) == sorted([hidden * 4, 4, 4, 4])
    assert moved["down"] == [logits.size * 4]


@pytest.mark.parametrize("name", ["qwen3_int4_b64", "qwen2_int8_b0"])
def test_gpu_kernels_on_a_model(monkeypatch, name):
    monkeypatch.setenv("MNNGPU_OPENCL_VARIANT", "gpu")
    ref, first_logits = fixture_reference(name)
    model = load_fixture(name)
    assert model.runtime.backend().variant == "gpu"
    for k in (0, 4):  # one chunk, two chunks
        prompt = ref["prompts"][k]
        first, tokens = first_logits_and_greedy(model, prompt["ids"], 8)
        assert np.abs(first - first_logits[k]).max() <= 1e-3 * first_logits[k].std()
        assert tokens == prompt["greedy"][:8]


def test_fp16_storage_on_a_model(monkeypatch):
    from mnngpu.backends.opencl import OpenCLBackend

    monkeypatch.setattr(OpenCLBackend, "_half_storage", lambda self, config: True)
    name = "qwen3_int4_b64"
    ref, first_logits = fixture_reference(name)
    model = load_fixture(name, precision="low")
    assert model.runtime.backend().half
    for k in (0, 1):
        first, _ = first_logits_and_greedy(model, ref["prompts"][k]["ids"], 1)
        assert np.abs(first - first_logits[k]).max() <= 2e-2 * first_logits[k].std()
