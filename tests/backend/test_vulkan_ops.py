"""Every op of the Vulkan backend, alone, through the Backend interface, against tests/reference.py
and plain numpy indexing. Skipped where no Vulkan driver is installed (CI runs lavapipe)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from mnngpu.backend import BackendConfig, Node, Tensor
from mnngpu.backend.kv import KVMeta
from mnngpu.errors import InputError
from mnngpu.format import params as P
from mnngpu.format.quant import QuantizedLinear
from mnngpu.runtime import fusion
from tests import reference
from tests.backend import harness
from tests.backend.harness import OneOp, run, run_graph
from tests.conftest import backend_or_skip

RTOL = 2e-5


def close(got, want, rtol=RTOL):
    reference.assert_close(got, want, rtol)


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


# ---- Convolution (linear) ---------------------------------------------------------------------

@pytest.mark.parametrize("bits, block, kind", [(4, 32, "q4"), (4, 96, "q4"), (8, 48, "q8"), (8, 96, "q8"),
                                               (4, 4, "dense"), (3, 8, "q8"), (4, 6, "dense")])
@pytest.mark.parametrize("rows", [1, 13])
def test_quantized_linear(vulkan, bits, block, kind, rows):
    rng = np.random.default_rng(bits * 100 + block + rows)
    weight, dense = harness.quantized_linear(rng, oc=72, ic=96, bits=bits, block=block, bias=rows == 13)
    bias = weight.bias
    backend = make_backend(vulkan)
    node = harness.conv_node(weight)
    x = rng.normal(0, 1, (rows, 96, 1, 1)).astype(np.float32)
    got = run(backend, node, [x])
    assert node.weights["vulkan"].kind.startswith(kind) and "weight" not in node.weights
    close(got.reshape(rows, 72), harness.linear_reference(x.reshape(rows, 96), dense, bias), 1e-5)


@pytest.mark.parametrize("precision, dtype, rtol", [("high", np.float32, 1e-5), ("low", np.float16, 2e-3)])
@pytest.mark.parametrize("rows", [1, 9])
def test_float_linear(vulkan, precision, dtype, rtol, rows):
    rng = np.random.default_rng(rows)
    w = rng.normal(0, 0.2, (24, 40)).astype(dtype)
    weight = QuantizedLinear(24, 40, 16 if dtype == np.float16 else 32, 40, False, np.zeros((24, 0), np.uint8),
                             np.zeros((24, 0), np.float32), np.zeros((24, 0), np.float32), None, float_weight=w)
    backend = make_backend(vulkan, precision)
    x = rng.normal(0, 1, (rows, 40, 1, 1)).astype(np.float32)
    got = run(backend, harness.conv_node(weight), [x])
    close(got.reshape(rows, 24), x.reshape(rows, 40).astype(np.float64) @ w.astype(np.float64).T, rtol)


@pytest.mark.parametrize("rows", [1, 11])
def test_linear_split_across_bindings(vulkan, rows):
    """A layer larger than maxStorageBufferRange runs as parts of output rows, one binding each."""
    rng = np.random.default_rng(7)
    weight, dense = harness.quantized_linear(rng, oc=250, ic=256, bits=4, block=32, bias=True)
    backend = make_backend(vulkan, max_binding_bytes=128 * 100)   # 100 rows of 128 code bytes per part
    node = harness.conv_node(weight)
    x = rng.normal(0, 1, (rows, 256, 1, 1)).astype(np.float32)
    got = run(backend, node, [x])
    assert [p.rows for p in node.weights["vulkan"].parts] == [100, 100, 50]
    close(got.reshape(rows, 250), harness.linear_reference(x.reshape(rows, 256), dense, weight.bias), 1e-5)


@pytest.mark.parametrize("bits, block", [(4, 64), (8, 32), (4, 4)])
@pytest.mark.parametrize("rows", [1, 9])
def test_gated_linear_is_up_times_silu_gate(vulkan, bits, block, rows):
    rng = np.random.default_rng(5 + rows + bits)
    (gate, gate_w), (up, up_w) = (harness.quantized_linear(rng, 200, 128, bits, block, bias=True) for _ in range(2))
    x = rng.normal(0, 1, (rows, 128, 1, 1)).astype(np.float32)
    backend = make_backend(vulkan, max_binding_bytes=8000)    # the layers split into parts, alike
    node = harness.fused_linear(fusion.GATED_LINEAR, [gate, up])
    got = run(backend, node, [x])
    assert len(node.param.members[0].weights["vulkan"].parts) >= 2
    g = harness.linear_reference(x.reshape(rows, 128), gate_w, gate.bias)
    u = harness.linear_reference(x.reshape(rows, 128), up_w, up.bias)
    close(got.reshape(rows, 200), reference.silu_mul(u, g), 1e-5)


# ---- LayerNorm ------------------------------------------------------------------------------------

# ---- Attention ------------------------------------------------------------------------------------

def attention_node(layer: int = 0, scale: float = 0.0, output_c4: bool = False) -> Node:
    return Node("Attention", f"attn{layer}", P.AttentionParam(layer_index=layer, attnScale=scale, output_c4=output_c4))


def attention_inputs(rng, seq, heads, kv_heads, dim):
    q = rng.normal(0, 1, (1, seq, heads, dim)).astype(np.float32)
    k = rng.normal(0, 1, (1, seq, kv_heads, dim)).astype(np.float32)
    v = rng.normal(0, 1, (seq, kv_heads * dim, 1, 1)).astype(np.float32)
    return [q, k, v, np.zeros((1, 1, 1, 1), np.float32)]


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
@pytest.mark.parametrize("heads, kv_heads, dim, scale, output_c4", [(4, 2, 32, 0.0, True), (2, 1, 18, 0.0, False)])
def test_attention_at_precision_low(vulkan, variant, heads, kv_heads, dim, scale, output_c4):
    """tests/backend/test_ops.py's padded prefill then decode, with the KV cache in fp16: both
    kernel families (head_dim 18 takes the workgroup kernel in either)."""
    precision, rtol = "low", 3e-3
    rng = np.random.default_rng(heads * dim)
    backend = make_backend(vulkan, precision, variant=variant)
    meta = backend.kv_meta
    node = attention_node(scale=scale, output_c4=output_c4)
    prefill_in = attention_inputs(rng, 8, heads, kv_heads, dim)
    prefill = OneOp(backend, node, prefill_in)
    decode_in = attention_inputs(rng, 1, heads, kv_heads, dim)
    decode = OneOp(backend, node, decode_in)
    scale = scale or 1 / np.sqrt(dim)
    keys, values = [], []
    meta.add = 5
    got = prefill(*prefill_in)[0]
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
        got = decode(*step)[0]
        meta.sync()
        keys.append(step[1][0])
        values.append(step[2].reshape(1, kv_heads, dim))
        past = meta.previous - 1
        want = reference.causal_attention(step[0][0], np.concatenate(keys), np.concatenate(values), past, scale)
        close(got.reshape(1, heads, dim), want, rtol)


def test_attention_beyond_the_cache_is_an_input_error(vulkan):
    backend = make_backend(vulkan, max_tokens=4)   # capacity 4 (BackendConfig.prefill_len 0: no padding)
    backend.kv_meta.previous = backend.max_tokens + 100
    inputs = attention_inputs(np.random.default_rng(0), 1, 2, 1, 16)
    with pytest.raises(InputError, match="max_all_tokens"):
        OneOp(backend, attention_node(), inputs)(*inputs)


# ---- RoPE: the fused rotate-half against numpy ----

@pytest.mark.parametrize("split, cos_shape", [(16, (1, 5, 1, 32)), (12, (5, 1, 32)), (16, (1, 5, 3, 32))])
def test_rope_is_one_dispatch(vulkan, split, cos_shape):
    rng = np.random.default_rng(13)
    x = rng.normal(0, 1, (1, 5, 3, 32)).astype(np.float32)
    cos, sin = (rng.normal(0, 1, cos_shape).astype(np.float32) for _ in range(2))
    backend = make_backend(vulkan)
    ops, constants = reference.rotate_half_graph(split, axis=3)
    fused = fusion.fuse(ops, set(backend.executions), graph_outputs={17})
    pipeline, got = run_graph(backend, fused, constants, [x, cos, sin], 17)
    assert [op.node.type for op in fused] == [fusion.ROPE] and pipeline.backend_of(pipeline.steps[0].outputs[0]) is backend
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
    fused = fusion.fuse(ops, set(backend.executions), graph_outputs={17})
    pipeline, got = run_graph(backend, fused, constants, [x, cos, sin], 17)
    assert [op.node.type for op in fused] == [fusion.ROPE] and pipeline.backend_of(pipeline.steps[-1].outputs[0]) is not backend
    rotated = np.concatenate([-x[:, :, 2:], x[:, :, :2]], axis=2)
    close(got, x.astype(np.float64) * cos + rotated * sin)


# ---- elementwise ----------------------------------------------------------------------------------

def positive_pair(rng, shape_a, shape_b):
    return rng.uniform(0.5, 3, shape_a).astype(np.float32), rng.uniform(0.5, 3, shape_b).astype(np.float32)


UNARY_DOMAIN = {"ACOS": (-0.99, 0.99), "ASIN": (-0.99, 0.99), "LOG": (0.1, 5), "SQRT": (0.1, 5), "RSQRT": (0.1, 5),
                "TAN": (-1.2, 1.2), "RECIPROCAL": (0.2, 4)}


def test_rope_angles_at_long_positions(vulkan):
    """cos/sin of position x inv_freq up to position 2048 stay within float32 rounding of numpy's."""
    angles = (np.arange(0, 2048, 7, dtype=np.float32)[:, None] * np.float32(0.9)).astype(np.float32)
    for op, func in (("COS", np.cos), ("SIN", np.sin)):
        got = run(make_backend(vulkan), Node("UnaryOp", op, P.UnaryOp(opType=op)), [angles])
        assert np.abs(got - func(angles.astype(np.float64))).max() < 1e-3


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
        assert np.array_equal(op(*arrays)[0], x.reshape(shape))


def test_gather_with_device_indices_is_declined(vulkan):
    backend = make_backend(vulkan)
    x = Tensor((4, 3), np.dtype(np.float32))
    indices = Tensor((2,), np.dtype(np.int32))
    assert backend.onCreate([x, indices], [Tensor((2, 3), np.dtype(np.float32))], Node("GatherV2", "g", None)) is None


# ---- the device layer -----------------------------------------------------------------------------

def test_recorded_commands_replay_on_new_inputs(vulkan):
    rng = np.random.default_rng(4)
    a, b = positive_pair(rng, (3, 8), (3, 8))
    op = OneOp(make_backend(vulkan), Node("BinaryOp", "add", P.BinaryOp(opType="ADD")), [a, b])
    for _ in range(3):
        a, b = positive_pair(rng, (3, 8), (3, 8))
        close(op(a, b)[0], a.astype(np.float64) + b)


def test_staged_memory_path(vulkan):
    """Device memory the host cannot map (discrete GPUs) goes through staging copies."""
    from mnngpu.backends.vulkan.memory import MemoryArena

    backend = make_backend(vulkan)
    backend.arena = MemoryArena(backend.device, staged=True)
    rng = np.random.default_rng(6)
    weight, dense = harness.quantized_linear(rng, oc=20, ic=32, bits=4, block=32, bias=True)
    x = rng.normal(0, 1, (2, 32, 1, 1)).astype(np.float32)
    got = run(backend, harness.conv_node(weight), [x])
    assert node_buffers_unmapped(backend)
    close(got.reshape(2, 20), harness.linear_reference(x.reshape(2, 32), dense, weight.bias), 1e-5)


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
@pytest.mark.parametrize("bits", [4, 8])
def test_one_row_linear_over_a_wide_input(vulkan, variant, bits):
    """The GPU variant (linear_split.comp) splits each output quad's input width across 32 invocations of a
    workgroup: 100 groups of 8 inputs leave the slices uneven, 70 outputs take three workgroups
    (the last quad half full), and the bias and the gated form are added after the slices'
    sum. The CPU variant runs the same case whole."""
    rng = np.random.default_rng(bits + len(variant))
    gate, gate_dense = harness.quantized_linear(rng, oc=70, ic=800, bits=bits, block=32, bias=True)
    up, up_dense = harness.quantized_linear(rng, oc=70, ic=800, bits=bits, block=32, bias=True)
    x = rng.normal(0, 1, (1, 800, 1, 1)).astype(np.float32)
    row = x.reshape(1, 800)
    backend = make_backend(vulkan, variant=variant)
    close(run(backend, harness.conv_node(gate), [x]).reshape(1, 70),
          harness.linear_reference(row, gate_dense, gate.bias), 1e-5)
    gated = OneOp(make_backend(vulkan, variant=variant), harness.fused_linear(fusion.GATED_LINEAR, [gate, up]), [x])
    g = harness.linear_reference(row, gate_dense, gate.bias)
    close(gated(x)[0].reshape(1, 70), harness.linear_reference(row, up_dense, up.bias) * g / (1 + np.exp(-g)), 1e-5)


@pytest.mark.parametrize("max_invocations, kernel", [(1024, "linear_split_q4"), (128, "linear_gemv_q4")])
def test_gpu_linear_needs_workgroups_of_256(vulkan, monkeypatch, max_invocations, kernel):
    """linear_split's workgroup is 256 invocations; a GPU whose workgroups stop at Vulkan's
    guaranteed 128 keeps the one-invocation-per-quad kernel."""
    backend = make_backend(vulkan, variant="gpu")
    monkeypatch.setattr(backend.device, "max_invocations", max_invocations)
    rng = np.random.default_rng(8)
    weight, dense = harness.quantized_linear(rng, oc=20, ic=64, bits=4, block=32, bias=True)
    x = rng.normal(0, 1, (1, 64, 1, 1)).astype(np.float32)
    op = OneOp(backend, harness.conv_node(weight), [x])
    assert [d.kernel.name for d in op.execution.segment.dispatches] == [kernel]
    close(op(x)[0].reshape(1, 20), harness.linear_reference(x.reshape(1, 64), dense, weight.bias), 1e-5)


def test_uncached_mapped_memory_is_read_through_a_host_cached_copy(vulkan, monkeypatch):
    """A discrete GPU's BAR is mapped but not host-cached: written through the mapping, read back
    through a copy into host-cached memory, as a CPU read of uncached memory crawls."""
    from mnngpu.backends.vulkan import memory

    monkeypatch.setattr(memory.MemoryArena, "_host_cached", lambda arena: arena.readback)
    backend = make_backend(vulkan)
    rng = np.random.default_rng(7)
    weight, dense = harness.quantized_linear(rng, oc=20, ic=32, bits=4, block=32, bias=True)
    x = rng.normal(0, 1, (2, 32, 1, 1)).astype(np.float32)
    got = run(backend, harness.conv_node(weight), [x])
    probe = backend.arena.allocate(64)
    assert probe.view is not None and not probe.cached
    assert backend.arena._transfer_buffers["readback"].cached
    close(got.reshape(2, 20), harness.linear_reference(x.reshape(2, 32), dense, weight.bias), 1e-5)


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
    record = program.CommandSegment.record
    monkeypatch.setattr(program.CommandSegment, "record", lambda self, *a: (recorded.append(self), record(self, *a))[1])
    for prompt in ref["prompts"]:   # one and two prefill chunks
        model.reset()
        tokens = [int(np.asarray(model.forward(prompt["ids"]))[0, -1].argmax())]
        tokens.append(int(np.asarray(model.forward([tokens[-1]]))[0, -1].argmax()))
        assert tokens == prompt["greedy"][:2]
    ran = [module for module in model.pool.modules.values() if module.session.pipelines]
    assert len(ran) >= 2 and len(recorded) == len(ran)   # the decode module and the prefill widths used
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
    # the embedding row, the position (the mask is a host input, folded at resize), the KV lengths
    assert sorted(moved["up"]) == sorted([hidden * 4, 4, *step_writes])
    assert moved["down"] == [logits.size * 4]
    assert moved["submits"] == 1
