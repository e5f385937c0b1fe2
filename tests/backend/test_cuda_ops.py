"""Every op of the CUDA backend, alone, through the Backend interface, against tests/reference.py
or plain numpy indexing, in each storage (fp32; fp16 and bf16 at a looser tolerance). Then the
CUDA-graph promise: the decode launches are captured once and replayed with new inputs.

Without cupy or a CUDA device every test here skips with the reason, except the ones that
check that the constructor then raises BackendUnavailableError naming what to install.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from mnngpu.backend import BackendConfig, Node, Tensor, create_backend
from mnngpu.errors import BackendUnavailableError
from mnngpu.format.bits import pack_nibbles
from mnngpu.format.quant import QuantizedLinear
from mnngpu.runtime import shapes
from mnngpu.runtime.kv import KVMeta
from tests import reference

STORAGES = ["fp32", "bf16", "fp16"]
TOLERANCE = {"fp32": 2e-5, "fp16": 1e-2, "bf16": 4e-2}  # relative to the result's largest value
rng = np.random.default_rng(11)


def make_backend(storage: str = "fp32"):
    from mnngpu.backends.cuda import CUDABackend
    from mnngpu.backends.cuda.storage import BF16, FP16, FP32

    try:
        return CUDABackend(BackendConfig(precision="high"), KVMeta(),
                           storage={"fp32": FP32, "fp16": FP16, "bf16": BF16}[storage])
    except BackendUnavailableError as exc:
        pytest.skip(f"cuda unavailable: {exc}")


@pytest.fixture(params=STORAGES)
def backend(request):
    return make_backend(request.param)


def close(backend, got: np.ndarray, want: np.ndarray) -> None:
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    scale = max(float(np.abs(want).max()), 1e-6)
    assert np.abs(got - want).max() <= TOLERANCE[backend.storage.name] * scale


def stored(backend, array: np.ndarray) -> np.ndarray:
    """float32 values the backend's storage holds exactly, so rounding never flips a comparison."""
    return backend.storage.from_storage(backend.storage.to_storage(np.asarray(array, dtype=np.float32)))


class Host:
    """An input known on the host (a constant or a folded shape value)."""

    def __init__(self, array):
        self.array = np.asarray(array)


def resize(backend, node: Node, inputs: list):
    """Create and resize one op as the Pipeline does; returns (execution, inputs, outputs)."""
    tensors = []
    for value in inputs:
        array = value.array if isinstance(value, Host) else np.asarray(value)
        tensor = Tensor(array.shape, array.dtype, host=array if isinstance(value, Host) else None)
        backend.upload(tensor, array)
        tensors.append(tensor)
    outputs = [Tensor(tuple(shape), np.dtype(dtype)) for shape, dtype in shapes.infer(node, tensors)]
    backend.onResizeBegin()
    execution = backend.onCreate(tensors, outputs, node)
    assert execution is not None, f"{node.type} declined"
    for tensor in outputs:
        backend.alloc(tensor)
    execution.onResize(tensors, outputs)
    backend.onResizeEnd()
    return execution, tensors, outputs


def run(backend, node: Node, inputs: list) -> list[np.ndarray]:
    execution, tensors, outputs = resize(backend, node, inputs)
    if execution.needs_run:
        execution.onExecute(tensors, outputs)
    backend.finish()
    return [backend.download(t) for t in outputs]


# ---- Convolution (linear) ---------------------------------------------------------------------------------------

def linear_node(weight: QuantizedLinear) -> Node:
    common = SimpleNamespace(inputCount=weight.ic, outputCount=weight.oc)
    return Node("Convolution", "linear", SimpleNamespace(common=common), {"weight": weight})


def quantized(oc: int, ic: int, bits: int, block: int, bias: bool):
    codes = rng.integers(0, 1 << bits, (oc, ic), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, (oc, ic // block)).astype(np.float32)
    zeros = rng.uniform(-0.5, 0.0, (oc, ic // block)).astype(np.float32)
    packed = pack_nibbles(codes) if bits == 4 else codes
    b = rng.standard_normal(oc).astype(np.float32) if bias else None
    return QuantizedLinear(oc, ic, bits, block, False, packed, scales, zeros, b), codes


LINEAR_CASES = {  # name: (oc, ic, bits, block)
    "int4-words": (20, 128, 4, 64),       # 32-bit words of 8 codes in one block
    "int4-bytes": (9, 36, 4, 12),         # a block that splits words: the byte kernel
    "int4-odd-ic": (5, 15, 4, 5),         # a half-filled last byte
    "int8-words": (13, 96, 8, 96),        # channel-wise
    "int8-bytes": (7, 30, 8, 10),
    "int3": (9, 64, 3, 32),               # other widths: one code a byte
}


@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("case", list(LINEAR_CASES))
def test_quantized_linear(backend, case, rows):
    oc, ic, bits, block = LINEAR_CASES[case]
    weight, codes = quantized(oc, ic, bits, block, bias=case != "int3")
    x = stored(backend, rng.standard_normal((rows, ic, 1, 1)))
    node = linear_node(weight)
    backend.rearrange(node)
    assert "weight" not in node.weights  # the raw arrays are dropped once packed
    (y,) = run(backend, node, [x])
    want = reference.linear(x.reshape(rows, ic), codes, weight.scales, weight.zeros, block, weight.bias)
    close(backend, y.reshape(rows, oc), want)


def test_prefill_linear_in_several_weight_tiles(backend, monkeypatch):
    from mnngpu.backends.cuda import matmul

    monkeypatch.setattr(matmul, "TILE_ELEMENTS", 3 * 64)  # 3 rows a tile: 4 tiles for 10 rows
    weight, codes = quantized(10, 64, 4, 32, bias=True)
    x = stored(backend, rng.standard_normal((6, 64, 1, 1)))
    node = linear_node(weight)
    backend.rearrange(node)
    (y,) = run(backend, node, [x])
    close(backend, y.reshape(6, 10), reference.linear(x.reshape(6, 64), codes, weight.scales, weight.zeros, 32,
                                                      weight.bias))


@pytest.mark.parametrize("rows", [1, 5])
def test_float_linear(backend, rows):
    oc, ic = 10, 40
    w = rng.standard_normal((oc, ic)).astype(np.float32)
    empty = np.zeros((oc, 0), dtype=np.float32)
    weight = QuantizedLinear(oc, ic, 32, ic, True, np.zeros((oc, 0), np.uint8), empty, empty, None, float_weight=w)
    x = stored(backend, rng.standard_normal((rows, ic, 1, 1)))
    node = linear_node(weight)
    backend.rearrange(node)
    (y,) = run(backend, node, [x])
    close(backend, y.reshape(rows, oc), x.reshape(rows, ic).astype(np.float64) @ stored(backend, w).T)


# ---- LayerNorm --------------------------------------------------------------------------------------------------

def norm_node(rms: bool, gamma, beta, axes: int = 1) -> Node:
    param = SimpleNamespace(axis=list(range(-axes, 0)), epsilon=1e-5, useRMSNorm=rms)
    return Node("LayerNorm", "norm", param, {"gamma": gamma, "beta": beta})


@pytest.mark.parametrize("width", [32, 100, 896])
@pytest.mark.parametrize("rms", [True, False])
def test_layer_norm(backend, rms, width):
    x = stored(backend, rng.standard_normal((3, 2, width)) * 2 + 0.5)
    gamma = rng.uniform(0.5, 1.5, width).astype(np.float32)
    beta = None if rms else rng.standard_normal(width).astype(np.float32)
    node = norm_node(rms, gamma, beta)
    backend.rearrange(node)
    (y,) = run(backend, node, [x])
    want = reference.rms_norm(x, gamma, 1e-5) if rms else reference.layer_norm(x, gamma, beta, 1e-5)
    close(backend, y, want)


def test_rms_norm_over_two_axes_without_gamma(backend):
    x = stored(backend, rng.standard_normal((2, 3, 4, 8)))
    node = norm_node(True, None, None, axes=2)
    backend.rearrange(node)
    (y,) = run(backend, node, [x])
    rows = x.reshape(6, 32)
    close(backend, y, reference.rms_norm(rows, np.ones(32), 1e-5).reshape(x.shape))


# ---- Attention --------------------------------------------------------------------------------------------------

def attention_node(output_c4: bool = False, scale: float = 0.0) -> Node:
    return Node("Attention", "attn", SimpleNamespace(kv_cache=True, layer_index=0, output_c4=output_c4,
                                                     attnScale=scale))


class AttentionSteps:
    """One layer's prefill (padded to `rows`) and decode executions, driven with KVMeta as Llm._run does."""

    def __init__(self, backend, heads: int, kv_heads: int, dim: int, rows: int, output_c4: bool = False):
        self.backend, self.heads, self.kv_heads, self.dim = backend, heads, kv_heads, dim
        self.node = attention_node(output_c4)
        self.modules = {n: resize(backend, self.node, self._inputs(n)) for n in sorted({rows, 1})}
        self.rows = rows
        self.keys = np.zeros((0, kv_heads, dim), np.float32)
        self.values = np.zeros_like(self.keys)

    def _inputs(self, seq: int) -> list:
        q = stored(self.backend, rng.standard_normal((1, seq, self.heads, self.dim)))
        k = stored(self.backend, rng.standard_normal((1, seq, self.kv_heads, self.dim)))
        v = stored(self.backend, rng.standard_normal((seq, self.kv_heads * self.dim, 1, 1)))
        return [q, k, v, np.zeros((1, 1, 1, 1), np.float32)]

    def step(self, real: int) -> tuple[np.ndarray, np.ndarray]:
        """Forward `real` new tokens (padded to the prefill rows unless one); (got, want) for them."""
        seq = 1 if real == 1 else self.rows
        execution, tensors, outputs = self.modules[seq]
        values = self._inputs(seq)
        for tensor, value in zip(tensors, values):
            self.backend.upload(tensor, value)
        meta = self.backend.kv_meta
        meta.add = real
        execution.onExecute(tensors, outputs)
        self.backend.finish()
        got = self.backend.download(outputs[0]).reshape(seq, self.heads, self.dim)[:real]
        q, k, v = values[0][0, :real], values[1][0, :real], values[2][:real].reshape(real, self.kv_heads, self.dim)
        past = meta.kept
        self.keys = np.concatenate([self.keys[:past], k])
        self.values = np.concatenate([self.values[:past], v])
        want = reference.causal_attention(q, self.keys, self.values, past, 1.0 / np.sqrt(self.dim))
        meta.sync()
        return got, want


@pytest.mark.parametrize("dim,output_c4", [(32, False), (64, True), (160, False)])
def test_attention_padded_prefill_then_decode(backend, dim, output_c4):
    steps = AttentionSteps(backend, heads=4, kv_heads=2, dim=dim, rows=6, output_c4=output_c4)
    for real in (4, 1, 1, 3, 1):
        close(backend, *steps.step(real))


def test_attention_over_several_key_tiles(backend):
    """Past 128 keys the kernel's online softmax spans tiles."""
    steps = AttentionSteps(backend, heads=2, kv_heads=1, dim=16, rows=100)
    for real in (100, 100, 1, 1):
        close(backend, *steps.step(real))


def test_attention_cache_grows_past_its_capacity(backend):
    backend.max_tokens = 4   # a capacity of 4 + one prefill chunk (100)
    steps = AttentionSteps(backend, heads=2, kv_heads=2, dim=8, rows=60)
    for real in (60, 60, 1):
        close(backend, *steps.step(real))
    assert backend.kv_caches[0].capacity >= 121


def test_attention_keeps_reserved_spans(backend):
    steps = AttentionSteps(backend, heads=2, kv_heads=1, dim=8, rows=5)
    close(backend, *steps.step(5))
    close(backend, *steps.step(1))               # 6 tokens cached
    meta = backend.kv_meta
    meta.remove, meta.reserve = 4, [(1, 2)]      # drop tokens 2..5 but keep 3 and 4
    keep = [0, 1, 3, 4]
    steps.keys, steps.values = steps.keys[keep], steps.values[keep]
    close(backend, *steps.step(1))
    assert meta.previous == 5


# ---- elementwise ------------------------------------------------------------------------------------------------

def binary_node(op: str) -> Node:
    return Node("BinaryOp", op, SimpleNamespace(opType=op))


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL", "REALDIV", "MUL_SILU", "MAXIMUM", "MINIMUM",
                                "SquaredDifference", "POW", "GREATER", "MOD"])
def test_binary_same_shape(backend, op):
    a = stored(backend, rng.uniform(0.5, 2.0, (3, 7)))
    b = stored(backend, rng.uniform(0.5, 2.0, (3, 7)))
    (y,) = run(backend, binary_node(op), [a, b])
    close(backend, y, reference.BINARY[op](a.astype(np.float64), b.astype(np.float64)))


@pytest.mark.parametrize("shape_a,shape_b,host_b", [((1, 3, 4, 8), (1, 3, 1, 8), False),
                                                     ((3, 1), (16,), True), ((2, 1, 5), (4, 1), False)])
def test_binary_broadcast(backend, shape_a, shape_b, host_b):
    a = stored(backend, rng.standard_normal(shape_a))
    b = stored(backend, rng.standard_normal(shape_b))
    (y,) = run(backend, binary_node("MUL"), [a, Host(b) if host_b else b])
    close(backend, y, a.astype(np.float64) * b)


@pytest.mark.parametrize("op", ["NEG", "COS", "SIN", "RSQRT", "EXP", "SILU", "SIGMOID", "ABS", "SQRT", "TANH",
                                "SQUARE", "RECIPROCAL", "LOG", "ROUND", "ERF", "GELU"])
def test_unary(backend, op):
    x = stored(backend, rng.uniform(0.2, 3.0, (2, 9)))
    (y,) = run(backend, Node("UnaryOp", op, SimpleNamespace(opType=op)), [x])
    close(backend, y, reference.UNARY[op](x.astype(np.float64)))


def test_cast_int_to_float_and_back(backend):
    positions = np.arange(5, 12, dtype=np.int32).reshape(1, 7)
    (y,) = run(backend, Node("Cast", "cast", SimpleNamespace(dstT="DT_FLOAT")), [positions])
    assert y.dtype == np.float32 and np.array_equal(y, positions)
    (z,) = run(backend, Node("Cast", "cast", SimpleNamespace(dstT="DT_INT32")), [np.float32([[-2.7, 3.9, 0.2]])])
    assert np.array_equal(z, np.int32([[-2, 3, 0]]))


def test_int_binary_op_is_left_to_the_cpu(backend):
    a = Tensor((3,), np.dtype(np.int32))
    assert backend.onCreate([a, a], [Tensor((3,), np.dtype(np.int32))], binary_node("ADD")) is None


# ---- data movement ----------------------------------------------------------------------------------------------

def test_onnx_slice_with_negative_step(backend):
    x = stored(backend, rng.standard_normal((1, 3, 4, 8)))
    node = Node("StridedSlice", "slice", SimpleNamespace(fromType=1))
    (y,) = run(backend, node, [x, Host(np.int32([6])), Host(np.int32([1])), Host(np.int32([3])), Host(np.int32([-2]))])
    assert np.array_equal(y, x[:, :, :, 6:1:-2])


@pytest.mark.parametrize("shrink,want", [(0, lambda x: x[:, 1:3]), (2, lambda x: x[:, 1])])
def test_tf_strided_slice_with_masks(backend, shrink, want):
    x = stored(backend, rng.standard_normal((2, 4, 5)))
    param = SimpleNamespace(fromType=0, beginMask=1, endMask=1, ellipsisMask=0, newAxisMask=0, shrinkAxisMask=shrink)
    node = Node("StridedSlice", "slice", param)
    (y,) = run(backend, node, [x, Host(np.int32([0, 1])), Host(np.int32([0, 3])), Host(np.int32([1, 1]))])
    assert np.array_equal(y, want(x))


def test_gather(backend):
    x = stored(backend, rng.standard_normal((2, 1, 3, 1, 8)))
    node = Node("GatherV2", "gather", SimpleNamespace(axis=0))
    (y,) = run(backend, node, [x, Host(np.int32(1)), Host(np.int32(0))])
    assert np.array_equal(y, x[1])
    (z,) = run(backend, node, [x, Host(np.int32([1, 0, -1])), Host(np.int32(2))])
    assert np.array_equal(z, np.take(x, [1, 0, 2], axis=2))


def test_gather_of_int32(backend):
    ids = np.arange(12, dtype=np.int32).reshape(3, 4)
    (y,) = run(backend, Node("GatherV2", "gather", None), [ids, Host(np.int32([2, 0])), Host(np.int32(1))])
    assert y.dtype == np.int32 and np.array_equal(y, ids[:, [2, 0]])


@pytest.mark.parametrize("axis", [0, 2, -1])
def test_concat(backend, axis):
    a = stored(backend, rng.standard_normal((2, 3, 4)))
    b = stored(backend, rng.standard_normal((2, 3, 4)))
    (y,) = run(backend, Node("Concat", "concat", SimpleNamespace(axis=axis)), [a, b])
    assert np.array_equal(y, np.concatenate([a, b], axis=axis))


@pytest.mark.parametrize("op,param,extra,want", [
    ("Reshape", SimpleNamespace(dims=[4, -1]), [], (4, 6)),
    ("Unsqueeze", SimpleNamespace(squeezeDims=[0]), [], (1, 2, 3, 4)),
    ("ConvertTensor", None, [], (2, 3, 4)),
])
def test_views_share_the_input_buffer(backend, op, param, extra, want):
    x = stored(backend, rng.standard_normal((2, 3, 4)))
    execution, tensors, outputs = resize(backend, Node(op, op, param), [x, *extra])
    assert execution.needs_run is False and outputs[0].device is tensors[0].device
    assert np.array_equal(backend.download(outputs[0]), x.reshape(want))


# ---- the CUDA graph ---------------------------------------------------------------------------------------------

def test_decode_launches_are_captured_once_and_replayed_with_new_inputs(backend):
    """A decode-shaped chain (linear, norm, attention) run as one recording: the first run launches,
    the second captures, later ones replay the graph; every run reads that step's inputs."""
    hidden, heads, dim = 64, 4, 16
    weight, codes = quantized(3 * hidden, hidden, 4, 32, bias=True)
    linear = linear_node(weight)
    gamma = rng.uniform(0.5, 1.5, hidden).astype(np.float32)
    norm = norm_node(True, gamma, None)
    for node in (linear, norm):
        backend.rearrange(node)
    x = Tensor((1, hidden, 1, 1), np.dtype(np.float32))
    qkv = Tensor((1, 3 * hidden, 1, 1), np.dtype(np.float32))
    backend.onResizeBegin()
    steps = []

    def place(node, inputs, outputs):
        execution = backend.onCreate(inputs, outputs, node)
        execution.onResize(inputs, outputs)
        steps.append((execution, inputs, outputs))

    backend.upload(x, np.zeros(x.shape, np.float32))
    place(linear, [x], [qkv])
    q, k, v = (Tensor((1, 1, heads, dim), np.dtype(np.float32)) for _ in range(3))
    for j, part in enumerate((q, k, v)):
        place(Node("StridedSlice", "split", SimpleNamespace(fromType=1)),
              [Tensor((1, 1, heads, 3 * dim), np.dtype(np.float32), device=backend.buffer(qkv)),
               Tensor((1,), np.dtype(np.int32), host=np.int32([j * dim])),
               Tensor((1,), np.dtype(np.int32), host=np.int32([(j + 1) * dim])),
               Tensor((1,), np.dtype(np.int32), host=np.int32([3])), Tensor((1,), np.dtype(np.int32), host=np.int32([1]))],
              [part])
    attended = Tensor((1, 1, hidden), np.dtype(np.float32))
    mask = Tensor((1, 1, 1, 1), np.dtype(np.float32), host=np.zeros((1, 1, 1, 1), np.float32))
    backend.upload(mask, mask.host)
    place(attention_node(), [q, k, v, mask], [attended])
    out = Tensor((1, 1, hidden), np.dtype(np.float32))
    place(norm, [attended], [out])
    backend.onResizeEnd()
    recording = backend.graphs.recordings[-1]
    meta, keys, values = backend.kv_meta, [], []
    for step in range(4):
        xs = stored(backend, rng.standard_normal(hidden))
        backend.upload(x, xs)
        meta.add = 1
        for execution, inputs, outputs in steps:
            execution.onExecute(inputs, outputs)
        backend.finish()
        got = backend.download(out).reshape(hidden)
        y = reference.linear(xs.reshape(1, hidden), codes, weight.scales, weight.zeros, 32, weight.bias)
        y = y.reshape(heads, 3 * dim)
        keys.append(y[:, dim: 2 * dim])
        values.append(y[:, 2 * dim:])
        att = reference.causal_attention(y[None, :, :dim], np.stack(keys), np.stack(values), step, 1 / np.sqrt(dim))
        close(backend, got, reference.rms_norm(att.reshape(hidden), gamma, 1e-5))
        meta.sync()
        assert (recording.graph is not None) == (step >= 1)


def test_graphs_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("MNNGPU_CUDA_GRAPH", "0")
    backend = make_backend()
    assert backend.graphs.enabled is False


def test_prefill_linear_is_not_captured(backend):
    weight, _ = quantized(8, 32, 4, 32, bias=False)
    node = linear_node(weight)
    backend.rearrange(node)
    execution, _, _ = resize(backend, node, [np.zeros((5, 32, 1, 1), np.float32)])
    assert execution.capturable is False
    assert backend.graphs.recordings[-1].capturable is False


# ---- no device --------------------------------------------------------------------------------------------------

def _device_present() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 (any failure means no device)
        return False


@pytest.mark.skipif(_device_present(), reason="a CUDA device is present")
def test_without_a_device_the_backend_is_unavailable_and_names_the_install():
    with pytest.raises(BackendUnavailableError, match="cupy"):
        create_backend("cuda", BackendConfig(precision="high"))


class _FakeRuntime:
    def __init__(self, count=None, error=None):
        self.count, self.error = count, error

    def getDeviceCount(self):
        if self.error:
            raise self.error
        return self.count


def _fake_cupy(runtime) -> SimpleNamespace:
    return SimpleNamespace(__version__="0.fake", cuda=SimpleNamespace(runtime=runtime))


@pytest.mark.parametrize("runtime,message", [(_FakeRuntime(count=0), "sees no CUDA device"),
                                             (_FakeRuntime(error=RuntimeError("cudaErrorNoDevice")),
                                              "cudaErrorNoDevice")])
def test_a_cupy_without_devices_gives_backend_unavailable(monkeypatch, runtime, message):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(runtime))
    from mnngpu.backends.cuda import CUDABackend

    with pytest.raises(BackendUnavailableError, match=message) as caught:
        CUDABackend(BackendConfig(precision="high"))
    assert "pip install" in str(caught.value)


def test_missing_cupy_gives_backend_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    from mnngpu.backends.cuda import CUDABackend

    with pytest.raises(BackendUnavailableError, match="mnngpu\\[cuda\\]"):
        CUDABackend(BackendConfig(precision="high"))
