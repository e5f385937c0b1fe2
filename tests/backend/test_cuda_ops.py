"""What is the CUDA backend's own (every op is in tests/backend/test_ops.py, in each storage): the
prefill linear's weight tiles, attention over key tiles, the cache growing and keeping reserved
spans, views sharing buffers; then the CUDA-graph promise: the decode launches are captured once
and replayed with new inputs.

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
from tests import reference
from tests.backend.harness import (
    KINDS,
    OneOp,
    close,
    conv_node,
    linear_reference,
    make,
    quantized_linear,
    run,
    stored,
)

rng = np.random.default_rng(11)


@pytest.fixture(params=[kind for kind in KINDS if kind.startswith("cuda")])
def backend(request):
    return make(request.param)


# ---- Convolution (linear) ---------------------------------------------------------------------------------------



def test_prefill_linear_in_several_weight_tiles(backend, monkeypatch):
    from mnngpu.backends.cuda.ops import linear

    monkeypatch.setattr(linear, "TILE_ELEMENTS", 3 * 64)  # 3 rows a tile: 4 tiles for 10 rows
    weight, dense = quantized_linear(rng, 10, 64, 4, 32, bias=True)
    x = stored(backend, rng.standard_normal((6, 64, 1, 1)))
    y = run(backend, conv_node(weight), [x])
    close(backend, y.reshape(6, 10), linear_reference(x.reshape(6, 64), dense, weight.bias))


# ---- LayerNorm --------------------------------------------------------------------------------------------------

def norm_node(rms: bool, gamma, beta, axes: int = 1) -> Node:
    param = SimpleNamespace(axis=list(range(-axes, 0)), epsilon=1e-5, useRMSNorm=rms)
    return Node("LayerNorm", "norm", param, {"gamma": gamma, "beta": beta})


# ---- Attention --------------------------------------------------------------------------------------------------

def attention_node(output_c4: bool = False, scale: float = 0.0) -> Node:
    return Node("Attention", "attn", SimpleNamespace(kv_cache=True, layer_index=0, output_c4=output_c4,
                                                     attnScale=scale))


class AttentionSteps:
    """One layer's prefill (padded to `rows`) and decode executions, driven with KVMeta as Llm._run does."""

    def __init__(self, backend, heads: int, kv_heads: int, dim: int, rows: int, output_c4: bool = False):
        self.backend, self.heads, self.kv_heads, self.dim = backend, heads, kv_heads, dim
        self.node = attention_node(output_c4)
        self.modules = {n: OneOp(backend, self.node, self._inputs(n)) for n in sorted({rows, 1})}
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
        values = self._inputs(seq)
        meta = self.backend.kv_meta
        meta.add = real
        got = self.modules[seq](*values)[0].reshape(seq, self.heads, self.dim)[:real]
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
    backend.max_tokens = 4   # a capacity of 4 (BackendConfig.prefill_len 0: no padding)
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


# ---- data movement ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,param,extra,want", [
    ("Reshape", SimpleNamespace(dims=[4, -1]), [], (4, 6)),
    ("Unsqueeze", SimpleNamespace(squeezeDims=[0]), [], (1, 2, 3, 4)),
    ("ConvertTensor", None, [], (2, 3, 4)),
])
def test_views_share_the_input_buffer(backend, op, param, extra, want):
    x = stored(backend, rng.standard_normal((2, 3, 4)))
    view = OneOp(backend, Node(op, op, param), [x, *extra])
    assert view.execution.needs_run is False and view.outputs[0].device is view.inputs[0].device
    assert np.array_equal(view(x)[0], x.reshape(want))


# ---- the CUDA graph ---------------------------------------------------------------------------------------------

def test_decode_launches_are_captured_once_and_replayed_with_new_inputs(backend):
    """A decode-shaped chain (linear, norm, attention) run as one recording: the first run launches,
    the second captures, later ones replay the graph; every run reads that step's inputs."""
    hidden, heads, dim = 64, 4, 16
    weight, dense = quantized_linear(rng, 3 * hidden, hidden, 4, 32, bias=True)
    linear = conv_node(weight)
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
              [Tensor((1, 1, heads, 3 * dim), np.dtype(np.float32), device=backend._buffer(qkv)),
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
        y = linear_reference(xs.reshape(1, hidden), dense, weight.bias)
        y = y.reshape(heads, 3 * dim)
        keys.append(y[:, dim: 2 * dim])
        values.append(y[:, 2 * dim:])
        att = reference.causal_attention(y[None, :, :dim], np.stack(keys), np.stack(values), step, 1 / np.sqrt(dim))
        close(backend, got, reference.rms_norm(att.reshape(hidden), gamma, 1e-5))
        meta.sync()
        assert (recording.graph is not None) == (step >= 1)


def test_graphs_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("MNNGPU_CUDA_GRAPH", "0")
    backend = make("cuda")
    assert backend.graphs.enabled is False


@pytest.mark.parametrize("tile_elements", [None, 3 * 64])
def test_prefill_linear_is_captured_and_replayed_with_new_inputs(backend, monkeypatch, tile_elements):
    """The prefill GEMM (weight tiles dequantized into scratch, cuBLAS through ctypes into scratch)
    goes into the graph from the second run on, with one weight tile or several; each run reads
    its own input."""
    from mnngpu.backends.cuda.ops import linear

    if tile_elements:
        monkeypatch.setattr(linear, "TILE_ELEMENTS", tile_elements)  # 3 rows a tile: 4 tiles for 10 rows
    weight, dense = quantized_linear(rng, 10, 64, 4, 32, bias=True)
    op = OneOp(backend, conv_node(weight), [np.zeros((5, 64, 1, 1), np.float32)])
    recording = backend.graphs.recordings[-1]
    assert backend.device.cublas is not None
    assert op.execution.capturable and recording.capturable
    for run_index in range(3):
        x = stored(backend, rng.standard_normal((5, 64, 1, 1)))
        (y,) = op(x)
        close(backend, y.reshape(5, 10), linear_reference(x.reshape(5, 64), dense, weight.bias))
        assert (recording.graph is not None) == (run_index >= 1)


def test_two_backends_capture_their_prefill_on_their_own_streams():
    """Two models in one process (AR and lookahead side by side): each backend's GEMMs go into its
    own graph, whatever the other ran last."""
    first, second = make("cuda"), make("cuda")
    weight, dense = quantized_linear(rng, 10, 64, 4, 32, bias=True)
    ops = [OneOp(backend, conv_node(weight), [np.zeros((5, 64, 1, 1), np.float32)]) for backend in (first, second)]
    for _ in range(3):
        for op in ops:
            x = stored(op.backend, rng.standard_normal((5, 64, 1, 1)))
            close(op.backend, op(x)[0].reshape(5, 10), linear_reference(x.reshape(5, 64), dense, weight.bias))
    assert all(backend.graphs.recordings[-1].graph is not None for backend in (first, second))


def test_without_the_capturable_gemm_prefill_runs_launch_by_launch(backend, monkeypatch):
    """Where libcublas cannot be reached through ctypes, the prefill GEMM stays with cupy.matmul,
    outside the graph, and gives the same values."""
    monkeypatch.setattr(backend.device, "_cublas", None, raising=False)
    weight, dense = quantized_linear(rng, 10, 64, 4, 32, bias=True)
    op = OneOp(backend, conv_node(weight), [np.zeros((5, 64, 1, 1), np.float32)])
    assert op.execution.capturable is False and backend.graphs.recordings[-1].capturable is False
    for _ in range(2):
        x = stored(backend, rng.standard_normal((5, 64, 1, 1)))
        close(backend, op(x)[0].reshape(5, 10), linear_reference(x.reshape(5, 64), dense, weight.bias))


def test_the_loaded_cublas_is_found_in_the_process_maps(tmp_path):
    from mnngpu.backends.cuda.cublas import loaded_library_path

    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /site/nvidia/cu13/lib/libcublasLt.so.13\n"
                    "7f02-7f03 r-xp 00000000 08:01 2 /site/nvidia/cu13/lib/libcublas.so.13\n"
                    "7f04-7f05 rw-p 00000000 00:00 0\n")
    assert loaded_library_path(maps) == "/site/nvidia/cu13/lib/libcublas.so.13"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /site/nvidia/cu13/lib/libcublasLt.so.13\n")
    assert loaded_library_path(maps) is None
    assert loaded_library_path(tmp_path / "absent") is None


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
