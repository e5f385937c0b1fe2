"""What is the CPU backend's own (every op is in tests/backend/test_ops.py): precision low's int16
activations, the parallel GEMV, weights kept as views of the file, the fused nodes against the ops
they replace, and the buffer planner's sharing rules."""

from __future__ import annotations

import dataclasses
import weakref
from pathlib import Path

import numpy as np
import pytest

from mnngpu.backend import BackendConfig, Node, Tensor
from mnngpu.backend.kv import KVMeta
from mnngpu.backends.cpu import CPUBackend
from mnngpu.backends.cpu.ops import linear
from mnngpu.format import params as P
from mnngpu.format.quant import QuantizedLinear
from mnngpu.runtime import fusion
from mnngpu.runtime.pipeline import GraphOp
from tests import reference
from tests.backend.harness import (
    OneOp,
    conv_node,
    fused_linear,
    linear_reference,
    quantized_linear,
    run,
    run_graph,
)
from tests.reference import assert_close as close


def make_backend(precision: str = "high", threads: int = 2) -> CPUBackend:
    return CPUBackend(BackendConfig(precision=precision, thread_num=threads), KVMeta())


def cpu_linear(x: np.ndarray, weight: QuantizedLinear, dense: np.ndarray, precision: str,
               file_alpha: tuple[np.ndarray, float] | None = None) -> np.ndarray:
    """x [rows, ic] times the layer, as the CPU computes it. At precision low an int4 layer (blocks
    of whole int16 chunks; any number of rows) multiplies the weights' levels with x rounded to
    int16 chunks, and their zero points with x itself. `file_alpha`: (the weight file's (min, scale)
    pairs, k), where the layer's alpha is the file's own."""
    integer = precision == "low" and weight.bits == 4 and weight.block_size % 64 == 0
    if not integer:
        return linear_reference(x, dense, weight.bias)
    levels, zeros = lane_weights(weight, *(file_alpha or ()))
    return linear_reference(reference.integer_chunks(x), levels, weight.bias) + x.astype(np.float64) @ zeros.T


def lane_weights(weight: QuantizedLinear, pairs: np.ndarray | None = None, k: float | None = None):
    """(codes * scale, k * scale + min) float64 [oc, ic] of an int4 layer as its lane groups hold
    it, each block's (min, scale) in float16: the file's `pairs` [oc, blocks, (min, scale)] with
    w = (code + k) * scale + min, or else the decoder's scales and zeros with the codes centred as
    the file's are (k = -2^(bits-1), min = zeros - k * scale in float32)."""
    if pairs is None:
        k = -float(1 << (weight.bits - 1))
        pairs = np.stack([weight.zeros - np.float32(k) * weight.scales, weight.scales], axis=-1)
    low, scale = pairs[..., 0], pairs[..., 1]
    scale = np.repeat(scale.astype(np.float16).astype(np.float64), weight.block_size, axis=1)
    low = np.repeat(low.astype(np.float16).astype(np.float64), weight.block_size, axis=1)
    return weight.unpacked_codes().astype(np.float64) * scale, k * scale + low


# ---- Convolution (linear), and its fused forms -----------------------------------------------

@pytest.mark.parametrize("bits, block", [(4, 64), (4, 32), (4, 128), (8, 64), (8, 256), (3, 16)])
@pytest.mark.parametrize("rows", [1, 2, 6, 13])   # 6: four rows sharing each weight row, then two
@pytest.mark.parametrize("precision", ["high", "low"])
def test_quantized_linear(bits, block, rows, precision):
    rng = np.random.default_rng(bits * 1000 + block + rows)
    weight, dense = quantized_linear(rng, oc=72, ic=256, bits=bits, block=block, bias=rows != 2)
    node = conv_node(weight)
    x = rng.normal(0, 1, (rows, 256, 1, 1)).astype(np.float32)
    got = run(make_backend(precision), node, [x])
    assert "weight" not in node.weights
    close(got.reshape(rows, 72), cpu_linear(x.reshape(rows, 256), weight, dense, precision), 2e-6)


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
    """Above linear.PARALLEL_BYTES the GEMV is split over the threads; the result is the same."""
    rng = np.random.default_rng(2)
    weight, dense = quantized_linear(rng, oc=4096, ic=512, bits=4, block=64, bias=True)
    assert weight.codes.nbytes >= max(linear.PARALLEL_BYTES.values())
    x = rng.normal(0, 1, (1, 512, 1, 1)).astype(np.float32)
    op = OneOp(make_backend(), conv_node(weight), [x])
    assert op.execution.kernel is op.execution.gemv_kernels[0]
    close(op(x)[0].reshape(1, 4096), linear_reference(x.reshape(1, 512), dense, weight.bias), 2e-6)


@pytest.mark.parametrize("rows", [1, 4, 9])   # one GEMV, GEMVs sharing weight spans, dequantize + BLAS
@pytest.mark.parametrize("precision", ["high", "low"])
def test_linear_group_gives_each_members_output(rows, precision):
    rng = np.random.default_rng(3 + rows)
    layers = [quantized_linear(rng, oc, 128, 4, 64, bias=True) for oc in (96, 32, 32)]
    x = rng.normal(0, 1, (rows, 128, 1, 1)).astype(np.float32)
    outs = OneOp(make_backend(precision), fused_linear(fusion.LINEAR_GROUP, [w for w, _ in layers]), [x])(x)
    for got, (weight, dense) in zip(outs, layers):
        close(got.reshape(rows, -1), cpu_linear(x.reshape(rows, 128), weight, dense, precision), 2e-6)


@pytest.mark.parametrize("rows", [1, 13])
def test_a_group_mixing_int4_and_int8_at_precision_low_computes_each_members_weights(rows):
    """The int4 member is in lane groups, the int8 one is not: the group takes the float path,
    which unpacks the lane groups into the same weights."""
    rng = np.random.default_rng(11 + rows)
    layers = [quantized_linear(rng, 96, 128, 4, 64, bias=True), quantized_linear(rng, 32, 128, 8, 64, bias=True)]
    x = rng.normal(0, 1, (rows, 128, 1, 1)).astype(np.float32)
    outs = OneOp(make_backend("low"), fused_linear(fusion.LINEAR_GROUP, [w for w, _ in layers]), [x])(x)
    for got, (weight, dense) in zip(outs, layers):
        if weight.bits == 4:
            dense = sum(lane_weights(weight))
        close(got.reshape(rows, -1), linear_reference(x.reshape(rows, 128), dense, weight.bias), 2e-6)


@pytest.mark.parametrize("rows", [1, 4, 7, 9])
@pytest.mark.parametrize("precision", ["high", "low"])
def test_gated_linear_is_up_times_silu_gate(rows, precision):
    """Both precisions of the CPU's row paths: one row (GEMV), a few (rows kernels), many (BLAS)."""
    rng = np.random.default_rng(5 + rows)
    (gate, gate_w), (up, up_w) = (quantized_linear(rng, 200, 128, 4, 64, bias=True) for _ in range(2))
    x = rng.normal(0, 1, (rows, 128, 1, 1)).astype(np.float32)
    got = run(make_backend(precision), fused_linear(fusion.GATED_LINEAR, [gate, up]), [x])
    g = cpu_linear(x.reshape(rows, 128), gate, gate_w, precision)
    u = cpu_linear(x.reshape(rows, 128), up, up_w, precision)
    close(got.reshape(rows, 200), reference.silu_mul(u, g), 5e-5)


@pytest.mark.parametrize("bits, precision", [(4, "low"), (4, "high"), (8, "low")])   # int16 x; float x
def test_a_row_of_a_few_gives_the_bits_it_gives_alone(bits, precision):
    """A verify block's row (2 to 7 rows: groups of four, then two or three) computes exactly what
    a one-row decode step computes for it, so lookahead's greedy tokens are AR's even where two
    logits nearly tie."""
    rng = np.random.default_rng(11)
    (gate, _), (up, _) = (quantized_linear(rng, 200, 256, bits, 64, bias=True) for _ in range(2))
    for node in (conv_node(gate), fused_linear(fusion.GATED_LINEAR, [gate, up])):
        x = rng.normal(0, 1, (7, 256, 1, 1)).astype(np.float32)
        alone = np.concatenate([run(make_backend(precision), node, [x[i:i + 1]]).reshape(1, -1) for i in range(7)])
        for rows in range(2, 8):
            together = run(make_backend(precision), node, [x[:rows]]).reshape(rows, -1)
            np.testing.assert_array_equal(together, alone[:rows])


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
    packed = linear.pack_linear(decoded, op.param)
    mapped = np.frombuffer(weights._map, dtype=np.uint8)
    assert packed.in_place and np.shares_memory(packed.alpha, mapped) and np.shares_memory(packed.codes, mapped)
    dense = decoded.dequantize().astype(np.float64)
    x = np.random.default_rng(6).normal(0, 1, (1, decoded.ic, 1, 1)).astype(np.float32)
    node = Node("Convolution", op.name, op.param, {"weight": decoded})
    got = run(make_backend(), node, [x])
    want = x.reshape(1, -1) @ dense.T + (0 if decoded.bias is None else decoded.bias)
    close(got.reshape(1, -1), want, 2e-6)


def _resident_kb(address: int) -> int:
    """Rss of the mapping of this process that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("Rss:"):
            return int(line.split()[1])
    raise AssertionError("no mapping holds the address")


def test_precision_low_repacks_int4_into_lane_groups_and_releases_the_files_pages():
    """Precision low's lane groups are a copy: the pages of the mapped file they came from leave
    the process's resident memory, so the weights are resident once, and the layer still computes
    the format decoder's weights."""
    from mnngpu.format import read_net
    from mnngpu.format.quant import read_linear
    from mnngpu.format.weights import WeightFile
    from tests.conftest import FIXTURES

    folder = FIXTURES / "qwen2_int4_b64"
    net = read_net(folder / "llm.mnn")
    weights = WeightFile(folder / "llm.mnn.weight")
    mapped = np.frombuffer(weights._map, dtype=np.uint8)
    int(mapped[::4096].sum())   # every page resident
    before = _resident_kb(mapped.ctypes.data)
    op = max((op for op in net.ops if op.type == "Convolution"), key=lambda op: read_linear(weights, op.param).codes.nbytes)
    weight = read_linear(weights, op.param)
    packed = linear.pack_linear(weight, op.param, lanes=True)
    assert packed.lanes and not np.shares_memory(packed.codes, mapped)
    whole_pages_kb = weight.codes.nbytes // 1024 - 8   # all but the two pages it shares at its ends
    assert before - _resident_kb(mapped.ctypes.data) >= whole_pages_kb > 0
    x = np.random.default_rng(8).normal(0, 1, (3, weight.ic, 1, 1)).astype(np.float32)
    got = run(make_backend("low"), Node("Convolution", op.name, op.param, {"weight": weight}), [x])
    pairs = linear._file_alpha(weight, op.param)   # the file's (min, scale), as the layer reads them
    file_alpha = (pairs, float(linear._code_offset(weight, pairs)))
    close(got.reshape(3, -1), cpu_linear(x.reshape(3, -1), weight, None, "low", file_alpha), 2e-6)


def test_an_int4_layer_whose_alpha_float16_cannot_hold_keeps_the_float_path():
    rng = np.random.default_rng(12)
    weight, dense = quantized_linear(rng, 48, 128, 4, 64, bias=False)
    weight = dataclasses.replace(weight, scales=weight.scales * np.float32(1e6), zeros=weight.zeros * np.float32(1e6))
    assert not linear.pack_linear(weight, None, lanes=True).lanes
    x = rng.normal(0, 1, (1, 128, 1, 1)).astype(np.float32)
    got = run(make_backend("low"), conv_node(weight), [x])
    close(got.reshape(1, -1), linear_reference(x.reshape(1, 128), dense * 1e6, None), 2e-6)


def test_a_norms_weights_are_copied_out_of_the_weight_file_at_load():
    """Read from the file each step, a norm's gamma would keep the file's page under it resident
    (a 2 MB page where the kernel maps files in large pages); the packed form is an equal copy."""
    from mnngpu.format import read_net
    from mnngpu.format.weights import WeightFile
    from mnngpu.runtime.static_module import decode_weights
    from tests.conftest import FIXTURES

    folder = FIXTURES / "qwen2_int4_b64"
    net = read_net(folder / "llm.mnn")
    weights = WeightFile(folder / "llm.mnn.weight")
    mapped = np.frombuffer(weights._map, dtype=np.uint8)
    op = next(op for op in net.ops if op.type == "LayerNorm")
    node = Node(op.type, op.name, op.param, decode_weights(op, weights))
    gamma = np.array(node.weights["gamma"])
    assert np.shares_memory(node.weights["gamma"], mapped)
    make_backend("low").rearrange(node)
    assert not any(np.shares_memory(array, mapped) for array in node.weights.values())
    np.testing.assert_array_equal(node.weights["gamma"], gamma)


# ---- norms, attention, elementwise ------------------------------------------------------------

def attention_node(layer: int = 0) -> Node:
    return Node("Attention", "attn", P.AttentionParam(layer_index=layer, output_c4=True))


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


def test_int_binary_and_unary_take_the_generic_path():
    a = np.array([[7, -8, 9]], dtype=np.int32)
    b = np.array([[2, 3, -4]], dtype=np.int32)
    got = run(make_backend(), Node("BinaryOp", "div", P.BinaryOp(opType="REALDIV")), [a, b])
    assert got.dtype == np.int32 and got.tolist() == [[3, -2, -2]]   # C division truncates toward zero
    got = run(make_backend(), Node("UnaryOp", "neg", P.UnaryOp(opType="NEG")), [a])
    assert got.tolist() == [[-7, 8, -9]]


# ---- RoPE: the fused pattern against the ops it replaces ------------------------------------------

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
    assert [op.node.type for op in fused] == [fusion.ROPE]
    pipeline, got = run_graph(make_backend(), fused, constants, [x, cos, sin], 17)
    assert len(pipeline.steps) == 1 and pipeline.steps[0].execution.split == split
    close(got, rotate_half_reference(x, cos, sin, split), 1e-6)
    _, unfused = run_graph(make_backend(), ops, constants, [x, cos, sin], 17)
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
    pipeline, got = run_graph(make_backend(), fused, constants, [x, cos, sin], 17)
    assert pipeline.steps[0].execution.split is None
    _, unfused = run_graph(make_backend(), ops, constants, [x, cos, sin], 17)
    close(got, unfused, 1e-6)


def test_fusion_leaves_backends_without_the_fused_types_alone():
    ops, _ = reference.rotate_half_graph(4, axis=3)
    assert fusion.fuse(ops, {"BinaryOp", "UnaryOp", "StridedSlice", "Concat"}, graph_outputs={17}) == ops


def test_gated_and_group_fusion_rewrite_the_exported_pattern():
    rng = np.random.default_rng(15)
    layers = [quantized_linear(rng, 48, 64, 4, 64, bias=False) for _ in range(4)]
    backend = make_backend()
    nodes = [conv_node(w, f"c{i}") for i, (w, _) in enumerate(layers)]
    for node in nodes:
        backend.rearrange(node)
        node.packed_for.add(backend.type)
    # 0 x -> q (1), k (2); gate (3), up (4) -> MUL_SILU(up, gate) (5)
    ops = [GraphOp(nodes[0], [0], [1]), GraphOp(nodes[1], [0], [2]), GraphOp(nodes[2], [0], [3]),
           GraphOp(nodes[3], [0], [4]), GraphOp(Node("BinaryOp", "act", P.BinaryOp(opType="MUL_SILU")), [4, 3], [5])]
    fused = fusion.fuse(ops, set(CPUBackend.executions), graph_outputs={1, 2, 5})
    assert [op.node.type for op in fused] == [fusion.LINEAR_GROUP, fusion.GATED_LINEAR]
    assert fused[1].node.param.members == [nodes[2], nodes[3]]
    x = rng.normal(0, 1, (3, 64, 1, 1)).astype(np.float32)
    _, got = run_graph(backend, fused, {}, [x], 5)
    g = linear_reference(x.reshape(3, 64), layers[2][1], None)
    u = linear_reference(x.reshape(3, 64), layers[3][1], None)
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
    backend.config.keep_tensors = not reuse
    pipeline, got = run_graph(backend, chain_graph(), {}, [x], 5)
    assert np.allclose(got, -(np.exp(-x) - x), rtol=1e-6)
    assert [s.execution.node.name for s in pipeline.steps] == ["a", "b", "c", "d"]   # reshapes are views
    buffers = {s.execution.node.name: s.outputs[0].device for s in pipeline.steps}
    assert np.shares_memory(pipeline.steps[1].inputs[0].device, buffers["a"])          # the view aliases
    assert not np.shares_memory(buffers["a"], buffers["b"])                            # both live at "c"
    assert not np.shares_memory(buffers["c"], buffers["a"]) and not np.shares_memory(buffers["c"], buffers["b"])
    assert np.shares_memory(buffers["d"], buffers["a"]) == reuse                       # "a" died at "c"
    _, again = run_graph(backend, chain_graph(), {}, [2 * x], 5)
    assert np.allclose(again, -(np.exp(-2 * x) - 2 * x), rtol=1e-6)


def test_a_graph_output_that_is_an_unread_view_keeps_its_buffer_to_the_end():
    """0 x -> neg 1 -> reshape 2 (a view: the graph output, read by no op), and 1 read on by exp 3
    -> neg 4 -> neg 5: 1's buffer must outlive its last reader (exp), or 4 and 5 overwrite the
    output before the run ends (as Qwen3-VL's image_embeds once were by its deepstack mergers)."""
    ops = [GraphOp(Node("UnaryOp", "a", P.UnaryOp(opType="NEG")), [0], [1]),
           GraphOp(Node("Reshape", "r", P.Reshape(dims=[2, 6])), [1], [2]),
           GraphOp(Node("UnaryOp", "b", P.UnaryOp(opType="EXP")), [1], [3]),
           GraphOp(Node("UnaryOp", "c", P.UnaryOp(opType="NEG")), [3], [4]),
           GraphOp(Node("UnaryOp", "d", P.UnaryOp(opType="NEG")), [4], [5])]
    x = np.random.default_rng(17).normal(0, 1, (3, 4)).astype(np.float32)
    _, got = run_graph(make_backend(), ops, {}, [x], 2)
    assert np.array_equal(got, -x.reshape(2, 6))


def test_vectorizable_exp_matches_numpy():
    import numba

    from mnngpu.backends.cpu.kernels import fastmath

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


def test_a_download_is_a_copy_that_later_downloads_never_overwrite_while_it_is_held():
    backend = make_backend()
    tensor = Tensor((1, 1000), np.float32, name="logits")
    tensor.device = np.zeros((1, 1000), np.float32)

    def run_step(value: float) -> np.ndarray:
        tensor.device[...] = value   # the next run writes the same buffer
        return backend.download(tensor)

    held = run_step(1.0)
    row = run_step(2.0)[0, 5:9]   # only a view of this one is kept
    later = run_step(3.0)
    np.testing.assert_array_equal(held, np.full((1, 1000), 1.0, np.float32))
    np.testing.assert_array_equal(row, np.full(4, 2.0, np.float32))
    np.testing.assert_array_equal(later, np.full((1, 1000), 3.0, np.float32))
    assert not np.shares_memory(held, tensor.device) and not np.shares_memory(later, held)

    last = weakref.ref(later)
    del later
    reused = run_step(4.0)   # nothing holds the last copy: its array takes this one
    assert last() is reused
    np.testing.assert_array_equal(reused, np.full((1, 1000), 4.0, np.float32))
    np.testing.assert_array_equal(held, np.full((1, 1000), 1.0, np.float32))
