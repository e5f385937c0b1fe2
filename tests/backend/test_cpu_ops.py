"""Every op of the CPU backend, alone, through the Backend interface, against tests/reference.py and
plain numpy; the fused nodes against the ops they replace; the buffer planner's sharing rules."""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu.backend import BackendConfig, Node, Tensor
from mnngpu.backends.cpu import CPUBackend
from mnngpu.backends.cpu.ops import matmul
from mnngpu.format import params as P
from mnngpu.format.quant import QuantizedLinear
from mnngpu.runtime import fusion, shapes
from mnngpu.runtime.kv import KVMeta
from mnngpu.runtime.pipeline import GraphOp, Pipeline
from tests import reference


def make_backend(precision: str = "high", threads: int = 2) -> CPUBackend:
    return CPUBackend(BackendConfig(precision=precision, thread_num=threads), KVMeta())


class OneOp:
    """One op resized once (buffers planned, arrays bound), then run on fresh inputs."""

    def __init__(self, backend, node: Node, arrays: list[np.ndarray], host: tuple[int, ...] = ()):
        self.backend = backend
        self.inputs = [Tensor(np.shape(a), np.asarray(a).dtype, f"in{i}", host=np.asarray(a) if i in host else None)
                       for i, a in enumerate(arrays)]
        self.outputs = [Tensor(tuple(s), np.dtype(d), "out") for s, d in shapes.infer(node, self.inputs)]
        backend.rearrange(node)
        backend.onResizeBegin()
        self.execution = backend.onCreate(self.inputs, self.outputs, node)
        assert self.execution is not None, f"{node.type} declined"
        for tensor in self.outputs:
            backend.alloc(tensor)
        self.execution.onResize(self.inputs, self.outputs)
        backend.onResizeEnd()

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        for tensor, array in zip(self.inputs, arrays):
            if tensor.host is None:
                self.backend.upload(tensor, np.asarray(array))
        self.execution.onExecute(self.inputs, self.outputs)
        self.backend.finish()
        return [self.backend.download(t) for t in self.outputs]


def run(backend, node, arrays, host=()):
    return OneOp(backend, node, arrays, host)(*arrays)[0]


def close(got, want, rtol):
    want = np.asarray(want, dtype=np.float64)
    scale = max(float(np.abs(want).max()), 1e-6)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= rtol * scale, np.abs(got - want).max() / scale


# ---- Convolution (linear), and its fused forms -----------------------------------------------

def quantized_linear(rng, oc: int, ic: int, bits: int, block: int, bias: bool):
    """(QuantizedLinear, unpacked levels, scales, zeros) with codes laid out as format/quant.py does."""
    levels = rng.integers(0, 1 << bits, size=(oc, ic), dtype=np.uint8)
    n_blocks = ic // block
    scales = rng.uniform(0.01, 0.1, size=(oc, n_blocks)).astype(np.float32)
    zeros = (-(1 << (bits - 1)) * scales + rng.normal(0, 0.01, size=(oc, n_blocks))).astype(np.float32)
    codes = (levels[:, 0::2] << 4 | levels[:, 1::2]).astype(np.uint8) if bits == 4 else levels
    weight = QuantizedLinear(oc, ic, bits, block, False, codes, scales, zeros,
                             rng.normal(0, 1, oc).astype(np.float32) if bias else None)
    return weight, levels, scales, zeros


def conv_node(weight, name: str = "fc") -> Node:
    common = P.Convolution2DCommon(inputCount=weight.ic, outputCount=weight.oc)
    return Node("Convolution", name, P.Convolution2D(common=common), {"weight": weight})


def want_linear(x, levels, scales, zeros, block, bias):
    return reference.linear(x, levels, scales, zeros, block, bias)


@pytest.mark.parametrize("bits, block", [(4, 64), (4, 32), (4, 128), (8, 64), (8, 256), (3, 16)])
@pytest.mark.parametrize("rows", [1, 2, 13])
@pytest.mark.parametrize("precision", ["high", "low"])
def test_quantized_linear(bits, block, rows, precision):
    rng = np.random.default_rng(bits * 1000 + block + rows)
    weight, levels, scales, zeros = quantized_linear(rng, oc=72, ic=256, bits=bits, block=block, bias=rows != 2)
    bias = weight.bias
    node = conv_node(weight)
    x = rng.normal(0, 1, (rows, 256, 1, 1)).astype(np.float32)
    got = run(make_backend(precision), node, [x])
    assert "weight" not in node.weights
    # precision low quantizes x to int16 steps of max|x|/32767 in the int4 decode GEMV
    close(got.reshape(rows, 72), want_linear(x.reshape(rows, 256), levels, scales, zeros, block, bias),
          1e-4 if precision == "low" else 2e-6)


def test_float_linear():
    rng = np.random.default_rng(1)
    dense = rng.normal(0, 1, (40, 64)).astype(np.float16)
    empty = np.zeros((40, 0), dtype=np.float32)
    weight = QuantizedLinear(40, 64, 16, 64, True, np.zeros((40, 0), np.uint8), empty, empty,
                             rng.normal(0, 1, 40).astype(np.float32), float_weight=dense)
    for rows in (1, 7):
        x = rng.normal(0, 1, (rows, 64, 1, 1)).astype(np.float32)
        got = run(make_backend(), conv_node(weight), [x])
        close(got.reshape(rows, 40), x.reshape(rows, 64).astype(np.float64) @ dense.astype(np.float64).T
              + weight.bias, 1e-6)


def test_large_decode_gemv_runs_parallel_and_matches():
    """Above matmul.PARALLEL_BYTES the GEMV is split over the threads; the result is the same."""
    rng = np.random.default_rng(2)
    weight, levels, scales, zeros = quantized_linear(rng, oc=4096, ic=512, bits=4, block=64, bias=True)
    assert weight.codes.nbytes >= max(matmul.PARALLEL_BYTES.values())
    x = rng.normal(0, 1, (1, 512, 1, 1)).astype(np.float32)
    op = OneOp(make_backend(), conv_node(weight), [x])
    assert op.execution.kernel is op.execution.gemv_kernels[0]
    close(op(x)[0].reshape(1, 4096), want_linear(x.reshape(1, 512), levels, scales, zeros, 64, weight.bias), 2e-6)


def fused_node(kind: str, weights: list) -> Node:
    members = [conv_node(w, f"m{i}") for i, w in enumerate(weights)]
    backend = make_backend()
    for member in members:
        backend.rearrange(member)
    return Node(kind, "fused", fusion.FusedLinearParam(members))


@pytest.mark.parametrize("rows", [1, 4, 9])   # one GEMV, GEMVs sharing weight spans, dequantize + BLAS
@pytest.mark.parametrize("precision", ["high", "low"])
def test_linear_group_gives_each_members_output(rows, precision):
    rng = np.random.default_rng(3 + rows)
    layers = [quantized_linear(rng, oc, 128, 4, 64, bias=True) for oc in (96, 32, 32)]
    x = rng.normal(0, 1, (rows, 128, 1, 1)).astype(np.float32)
    outs = OneOp(make_backend(precision), fused_node("LinearGroup", [w for w, *_ in layers]), [x])(x)
    for got, (weight, levels, scales, zeros) in zip(outs, layers):
        close(got.reshape(rows, -1), want_linear(x.reshape(rows, 128), levels, scales, zeros, 64, weight.bias),
              1e-4 if precision == "low" else 2e-6)


@pytest.mark.parametrize("rows", [1, 4, 9])
@pytest.mark.parametrize("precision", ["high", "low"])
def test_gated_linear_is_up_times_silu_gate(rows, precision):
    rng = np.random.default_rng(5 + rows)
    gate, up = (quantized_linear(rng, 200, 128, 4, 64, bias=True) for _ in range(2))
    x = rng.normal(0, 1, (rows, 128, 1, 1)).astype(np.float32)
    got = run(make_backend(precision), fused_node("GatedLinear", [gate[0], up[0]]), [x])
    g = want_linear(x.reshape(rows, 128), *gate[1:], 64, gate[0].bias)
    u = want_linear(x.reshape(rows, 128), *up[1:], 64, up[0].bias)
    close(got.reshape(rows, 200), reference.silu_mul(u, g), 2e-4 if precision == "low" else 1e-5)


def test_packed_weights_are_the_weight_files_own_bytes(tmp_path):
    """A real export: codes and alpha stay views of the mapped file, and the GEMV agrees with the
    format decoder's own dequantization."""
    from mnngpu.format import read_net
    from mnngpu.format.quant import read_linear
    from mnngpu.format.weights import WeightFile
    from tests.conftest import FIXTURES

    folder = FIXTURES / "qwen2_int4_b64"
    net = read_net(folder / "llm.mnn")
    weights = WeightFile(folder / "llm.mnn.weight")
    op = next(op for op in net.ops if op.type == "Convolution")
    decoded = read_linear(weights, op.param)
    packed = matmul.pack_linear(decoded, op.param)
    mapped = np.frombuffer(weights._map, dtype=np.uint8)
    assert packed.in_place and np.shares_memory(packed.alpha, mapped) and np.shares_memory(packed.codes, mapped)
    dense = decoded.dequantize().astype(np.float64)
    x = np.random.default_rng(6).normal(0, 1, (1, decoded.ic, 1, 1)).astype(np.float32)
    node = Node("Convolution", op.name, op.param, {"weight": decoded})
    got = run(make_backend(), node, [x])
    want = x.reshape(1, -1) @ dense.T + (0 if decoded.bias is None else decoded.bias)
    close(got.reshape(1, -1), want, 2e-6)


# ---- norms, attention, elementwise ------------------------------------------------------------

@pytest.mark.parametrize("rms", [True, False])
def test_layer_norm(rms):
    rng = np.random.default_rng(7)
    x = rng.normal(0, 2, (3, 5, 48)).astype(np.float32)
    gamma = rng.normal(1, 0.1, 48).astype(np.float32)
    beta = rng.normal(0, 0.1, 48).astype(np.float32)
    node = Node("LayerNorm", "ln", P.LayerNorm(axis=[-1], epsilon=1e-6, useRMSNorm=rms),
                {"gamma": gamma, "beta": None if rms else beta})
    want = reference.rms_norm(x, gamma, 1e-6) if rms else reference.layer_norm(x, gamma, beta, 1e-6)
    close(run(make_backend(), node, [x]), want, 1e-5)


def attention_node(layer: int = 0) -> Node:
    return Node("Attention", "attn", P.AttentionParam(layer_index=layer, output_c4=True))


def test_attention_prefill_then_decode_keeps_the_cache():
    rng = np.random.default_rng(8)
    heads, kv_heads, dim, prompt = 6, 2, 16, 7
    backend = make_backend()
    meta = backend.kv_meta
    qs, ks, vs = [], [], []
    for seq in (prompt, 1, 1):
        q = rng.normal(0, 1, (1, seq, heads, dim)).astype(np.float32)
        k = rng.normal(0, 1, (1, seq, kv_heads, dim)).astype(np.float32)
        v = rng.normal(0, 1, (seq, kv_heads * dim, 1, 1)).astype(np.float32)
        mask = np.zeros((1, 1, 1, 1), dtype=np.float32)
        meta.add = seq
        got = run(backend, attention_node(), [q, k, v, mask])
        past = meta.previous
        meta.sync()
        qs.append(q[0])
        ks.append(k[0])
        vs.append(v.reshape(seq, kv_heads, dim))
        want = reference.causal_attention(q[0], np.concatenate(ks), np.concatenate(vs), past, 1 / np.sqrt(dim))
        close(got.reshape(seq, heads, dim), want, 1e-5)


def test_attention_prefill_longer_than_a_query_block():
    from mnngpu.backends.cpu.ops.attention import QUERY_BLOCK

    rng = np.random.default_rng(9)
    seq, heads, kv_heads, dim = QUERY_BLOCK + 21, 4, 1, 8
    q = rng.normal(0, 1, (1, seq, heads, dim)).astype(np.float32)
    k = rng.normal(0, 1, (1, seq, kv_heads, dim)).astype(np.float32)
    v = rng.normal(0, 1, (seq, kv_heads * dim, 1, 1)).astype(np.float32)
    backend = make_backend()
    backend.kv_meta.add = seq
    got = run(backend, attention_node(), [q, k, v, np.zeros((1, 1, 1, 1), np.float32)])
    want = reference.causal_attention(q[0], k[0], v.reshape(seq, kv_heads, dim), 0, 1 / np.sqrt(dim))
    close(got.reshape(seq, heads, dim), want, 1e-5)


@pytest.mark.parametrize("op, a_shape, b_shape", [("ADD", (2, 3, 4), (2, 3, 4)), ("MUL", (1, 3, 5, 4), (1, 3, 1, 4)),
                                                  ("SUB", (4, 1), (1, 5)), ("REALDIV", (3, 4), (4,)),
                                                  ("MUL_SILU", (2, 6), (2, 6)), ("MAXIMUM", (3, 4), (3, 4))])
def test_binary(op, a_shape, b_shape):
    rng = np.random.default_rng(10)
    a = rng.normal(0, 1, a_shape).astype(np.float32)
    b = rng.uniform(0.5, 2, b_shape).astype(np.float32)
    want = {"ADD": a + b, "MUL": a * b, "SUB": a - b, "REALDIV": a / b, "MAXIMUM": np.maximum(a, b),
            "MUL_SILU": reference.silu_mul(a, b) if op == "MUL_SILU" else None}[op]
    # MUL_SILU's exp is ops/fastmath.exp (relative error below 5e-5)
    close(run(make_backend(), Node("BinaryOp", op, P.BinaryOp(opType=op)), [a, b]), want,
          5e-5 if op == "MUL_SILU" else 1e-6)


def test_int_binary_and_unary_take_the_generic_path():
    a = np.array([[7, -8, 9]], dtype=np.int32)
    b = np.array([[2, 3, -4]], dtype=np.int32)
    got = run(make_backend(), Node("BinaryOp", "div", P.BinaryOp(opType="REALDIV")), [a, b])
    assert got.dtype == np.int32 and got.tolist() == [[3, -2, -2]]   # C division truncates toward zero
    got = run(make_backend(), Node("UnaryOp", "neg", P.UnaryOp(opType="NEG")), [a])
    assert got.tolist() == [[-7, 8, -9]]


@pytest.mark.parametrize("op", ["COS", "SIN", "NEG", "EXP", "RSQRT", "SIGMOID"])
def test_unary(op):
    x = np.random.default_rng(11).uniform(0.2, 2, (3, 7)).astype(np.float32)
    want = {"COS": np.cos(x), "SIN": np.sin(x), "NEG": -x, "EXP": np.exp(x), "RSQRT": 1 / np.sqrt(x),
            "SIGMOID": 1 / (1 + np.exp(-x))}[op]
    close(run(make_backend(), Node("UnaryOp", op, P.UnaryOp(opType=op)), [x]), want, 1e-6)


def test_data_movement_ops():
    rng = np.random.default_rng(12)
    x = rng.normal(0, 1, (2, 3, 4)).astype(np.float32)
    y = rng.normal(0, 1, (2, 5, 4)).astype(np.float32)
    backend = make_backend()
    got = run(backend, Node("Concat", "cat", P.Axis(axis=1)), [x, y])
    assert np.array_equal(got, np.concatenate([x, y], axis=1))
    ends = np.array([3], dtype=np.int32)
    node = Node("StridedSlice", "slice", P.StridedSliceParam(fromType=1))
    got = run(backend, node, [x, np.array([1], np.int32), ends, np.array([2], np.int32), np.array([1], np.int32)],
              host=(1, 2, 3, 4))
    assert np.array_equal(got, x[:, :, 1:3])
    got = run(backend, Node("GatherV2", "gather", P.GatherV2()),
              [x, np.array([2, 0], np.int32), np.array([1], np.int32)], host=(1, 2))
    assert np.array_equal(got, x[:, [2, 0]])
    got = run(backend, Node("Cast", "cast", P.CastParam(dstT="DT_FLOAT")), [np.array([[1, 2]], np.int32)])
    assert got.dtype == np.float32 and got.tolist() == [[1.0, 2.0]]


# ---- RoPE: the fused pattern against the ops it replaces ------------------------------------------

def run_graph(ops, constants, arrays: list[np.ndarray], n_tensors: int, output: int, backend=None):
    backend = backend or make_backend()
    tensors: list[Tensor | None] = [None] * n_tensors
    pipeline = Pipeline(ops, backend, backend)
    for i, array in enumerate(arrays):
        tensors[i] = Tensor(array.shape, array.dtype, f"in{i}")
        pipeline.bind_input(tensors[i])
    for i, value in constants.items():
        tensors[i] = Tensor(value.shape, value.dtype, f"c{i}", host=value)
    pipeline.resize(tensors)
    for i, array in enumerate(arrays):
        backend.upload(tensors[i], array)
    pipeline.run()
    return backend.download(tensors[output]), pipeline


def rotate_half_reference(x, cos, sin, split):
    rotated = np.concatenate([-x[..., split:], x[..., :split]], axis=-1)
    return x.astype(np.float64) * cos + rotated * sin


@pytest.mark.parametrize("split", [16, 12])
def test_rope_pattern_fuses_into_one_step(split):
    rng = np.random.default_rng(13)
    dim = 32
    x = rng.normal(0, 1, (1, 5, 3, dim)).astype(np.float32)
    cos = rng.normal(0, 1, (1, 5, 1, dim)).astype(np.float32)
    sin = rng.normal(0, 1, (1, 5, 1, dim)).astype(np.float32)
    ops, constants = reference.rotate_half_graph(split, axis=3)
    fused = fusion.fuse(ops, set(CPUBackend.executions), graph_outputs={17})
    assert [op.node.type for op in fused] == ["RoPE"]
    got, pipeline = run_graph(fused, constants, [x, cos, sin], 18, 17)
    assert len(pipeline.steps) == 1 and pipeline.steps[0].execution.split == split
    close(got, rotate_half_reference(x, cos, sin, split), 1e-6)
    unfused, _ = run_graph(ops, constants, [x, cos, sin], 18, 17)
    close(got, unfused, 1e-6)


def test_rope_with_other_slices_runs_the_exported_ops():
    """Slices on another axis are no rotate-half: the fused node evaluates the original ops."""
    rng = np.random.default_rng(14)
    x = rng.normal(0, 1, (1, 4, 4, 4)).astype(np.float32)
    cos = rng.normal(0, 1, (1, 4, 1, 4)).astype(np.float32)
    sin = rng.normal(0, 1, (1, 4, 4, 4)).astype(np.float32)
    ops, constants = reference.rotate_half_graph(2, axis=2)
    ops[4] = GraphOp(Node("Concat", "cat", P.Axis(axis=2)), [13, 14], [15])
    fused = fusion.fuse(ops, set(CPUBackend.executions), graph_outputs={17})
    got, pipeline = run_graph(fused, constants, [x, cos, sin], 18, 17)
    assert pipeline.steps[0].execution.split is None
    unfused, _ = run_graph(ops, constants, [x, cos, sin], 18, 17)
    close(got, unfused, 1e-6)


def test_fusion_leaves_backends_without_the_fused_types_alone():
    ops, _ = reference.rotate_half_graph(4, axis=3)
    assert fusion.fuse(ops, {"BinaryOp", "UnaryOp", "StridedSlice", "Concat"}, graph_outputs={17}) == ops


def test_gated_and_group_fusion_rewrite_the_exported_pattern():
    rng = np.random.default_rng(15)
    layers = [quantized_linear(rng, 48, 64, 4, 64, bias=False) for _ in range(4)]
    backend = make_backend()
    nodes = [conv_node(w, f"c{i}") for i, (w, *_) in enumerate(layers)]
    for node in nodes:
        backend.rearrange(node)
    # 0 x -> q (1), k (2); gate (3), up (4) -> MUL_SILU(up, gate) (5)
    ops = [GraphOp(nodes[0], [0], [1]), GraphOp(nodes[1], [0], [2]), GraphOp(nodes[2], [0], [3]),
           GraphOp(nodes[3], [0], [4]), GraphOp(Node("BinaryOp", "act", P.BinaryOp(opType="MUL_SILU")), [4, 3], [5])]
    fused = fusion.fuse(ops, set(CPUBackend.executions), graph_outputs={1, 2, 5})
    assert [op.node.type for op in fused] == ["LinearGroup", "GatedLinear"]
    assert fused[1].node.param.members == [nodes[2], nodes[3]]
    x = rng.normal(0, 1, (3, 64, 1, 1)).astype(np.float32)
    got, _ = run_graph(fused, {}, [x], 6, 5, backend)
    g = want_linear(x.reshape(3, 64), *layers[2][1:], 64, None)
    u = want_linear(x.reshape(3, 64), *layers[3][1:], 64, None)
    close(got.reshape(3, 48), reference.silu_mul(u, g), 1e-5)


# ---- buffer planning ----------------------------------------------------------------------------

def chain_graph():
    """0 x -> neg 1 -> reshape 2 (view) -> exp 3 -> add(3, 1) 4 -> neg 5: tensor 1 lives until 4."""
    return [GraphOp(Node("UnaryOp", "a", P.UnaryOp(opType="NEG")), [0], [1]),
            GraphOp(Node("Reshape", "r", P.Reshape(dims=[2, 6])), [1], [2]),
            GraphOp(Node("UnaryOp", "b", P.UnaryOp(opType="EXP")), [2], [3]),
            GraphOp(Node("Reshape", "r2", P.Reshape(dims=[3, 4])), [3], [6]),
            GraphOp(Node("BinaryOp", "c", P.BinaryOp(opType="ADD")), [6, 1], [4]),
            GraphOp(Node("UnaryOp", "d", P.UnaryOp(opType="NEG")), [4], [5])]


@pytest.mark.parametrize("reuse", [True, False])
def test_planned_buffers_share_memory_only_between_disjoint_lifetimes(reuse):
    x = np.random.default_rng(16).normal(0, 1, (3, 4)).astype(np.float32)
    backend = make_backend()
    backend.reuse_memory = reuse
    got, pipeline = run_graph(chain_graph(), {}, [x], 7, 5, backend)
    assert np.allclose(got, -(np.exp(-x) - x), rtol=1e-6)
    assert [s.execution.node.name for s in pipeline.steps] == ["a", "b", "c", "d"]   # reshapes are views
    buffers = {s.execution.node.name: s.outputs[0].device for s in pipeline.steps}
    assert np.shares_memory(pipeline.steps[1].inputs[0].device, buffers["a"])          # the view aliases
    assert not np.shares_memory(buffers["a"], buffers["b"])                            # both live at "c"
    assert not np.shares_memory(buffers["c"], buffers["a"]) and not np.shares_memory(buffers["c"], buffers["b"])
    assert np.shares_memory(buffers["d"], buffers["a"]) == reuse                       # "a" died at "c"
    again, _ = run_graph(chain_graph(), {}, [2 * x], 7, 5, backend)
    assert np.allclose(again, -(np.exp(-2 * x) - 2 * x), rtol=1e-6)


def test_vectorizable_exp_matches_numpy():
    import numba

    from mnngpu.backends.cpu.ops import fastmath

    @numba.njit
    def apply(x, out):
        for i in range(x.size):
            out[i] = fastmath.exp(x[i])

    x = np.linspace(-79.0, 88.0, 100_001).astype(np.float32)
    got = np.empty_like(x)
    apply(x, got)
    want = np.exp(x.astype(np.float64))
    assert (np.abs(got - want) / want).max() < 5e-5
    edges = np.array([-1000.0, -90.0, 90.0, 1000.0], dtype=np.float32)
    apply(edges, got[:4])
    assert got[0] < 1e-34 and got[1] < 1e-34 and np.isinf(got[2]) and np.isinf(got[3])
