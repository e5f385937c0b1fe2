"""What is the OpenCL backend's own (every op is in tests/backend/test_ops.py, with both kernel
families and both storages): the KV cache growing, views sharing buffers, the device and precision
choices, then whole-model checks of what the fixed-shape design promises: one resize per module,
per-step transfers, the gpu kernels and fp16 on a real fixture."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("pyopencl")

from mnngpu.backend import BackendConfig, Node, Tensor
from mnngpu.backend.kv import KVMeta
from mnngpu.errors import BackendUnavailableError
from mnngpu.format import params as P
from mnngpu.ops import op_table
from tests import reference
from tests.backend.harness import KINDS, OneOp, close, make
from tests.conftest import FIXTURES
from tests.conftest import reference as fixture_reference


def make_backend(variant: str = "cpu", half: bool = False, precision: str = "high"):
    from mnngpu.backends.opencl import OpenCLBackend

    try:
        return OpenCLBackend(BackendConfig(precision=precision), KVMeta(), variant=variant, half_storage=half)
    except BackendUnavailableError as exc:
        pytest.skip(f"opencl unavailable: {exc}")


@pytest.fixture(params=[kind for kind in KINDS if kind.startswith("opencl")])
def backend(request):
    return make(request.param)


def halfable(array: np.ndarray) -> np.ndarray:
    """float32 values that fp16 storage holds exactly, so storage rounding never flips a comparison."""
    return np.asarray(array, dtype=np.float16).astype(np.float32)


class Host:
    """An input known on the host (a constant or a folded shape value)."""

    def __init__(self, array):
        self.array = np.asarray(array)


rng = np.random.default_rng(7)


# ---- Attention -------------------------------------------------------------------------------------------------

def test_attention_cache_grows_past_its_capacity(backend):
    """A history longer than the cache was sized for: the cache doubles and the kernels re-bind."""
    from mnngpu.backends.opencl.ops.attention import DeviceKVCache

    heads, kv_heads, dim, steps = 2, 2, 8, 7
    backend.kv_caches[0] = DeviceKVCache(backend, kv_heads, dim, capacity=2)
    q, k, v = (halfable(rng.standard_normal((steps, h, dim))) for h in (heads, kv_heads, kv_heads))
    node = Node("Attention", "attention", P.AttentionParam(layer_index=0))
    step = [q[:1][None], k[:1][None], v[:1].reshape(1, kv_heads * dim, 1, 1), np.zeros((1, 1, 1, 1), np.float32)]
    decode = OneOp(backend, node, step)
    for t in range(steps):
        backend.kv_meta.add = 1
        out = decode(q[t:t + 1][None], k[t:t + 1][None], v[t:t + 1].reshape(1, kv_heads * dim, 1, 1), step[3])[0]
        backend.kv_meta.sync()
        want = reference.causal_attention(q[t:t + 1], k[:t + 1], v[:t + 1], t, 1.0 / np.sqrt(dim))
        close(backend, out.reshape(1, heads, dim), want)
    assert steps <= backend.kv_caches[0].capacity < 2 * steps   # grown, by steps of at least half


# ---- data movement ---------------------------------------------------------------------------------------------

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
    (shape, dtype), = op_table.infer(Node(op, op, param), inputs)
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


def test_low_precision_uses_fp16_only_with_the_extension(recwarn):
    from mnngpu.backend import interface as backend_module

    backend = make_backend(precision="high", half=None)
    assert not backend.half
    backend_module._warned.clear()
    low = [make_backend(precision="low", half=None) for _ in range(2)]
    assert all(b.half == b.device.has_fp16 for b in low)
    warnings = [w for w in recwarn if "cl_khr_fp16" in str(w.message)]
    assert len(warnings) == (0 if backend.device.has_fp16 else 1)  # one warning line, not one per backend


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
            activation_bytes += sum(backend._nbytes(t) for s in pipeline.steps for t in s.outputs
                                    if getattr(s.execution, "view_of", None) is None)
    assert backend.pool.nbytes < activation_bytes / 2  # buffers are reused by lifetime

    moved = {"up": [], "down": []}
    write, download = backend._write, backend.download
    backend._write = lambda buffer, data: (moved["up"].append(data.nbytes), write(buffer, data))[1]
    backend.download = lambda tensor: (moved["down"].append(tensor.nbytes), download(tensor))[1]
    logits = np.asarray(model.forward([5]))
    hidden = json.loads((FIXTURES / name / "llm_config.json").read_text())["hidden_size"]
    # the embedding row, the position, the KV length (the mask is a host input, folded at resize); the logits
    assert sorted(moved["up"]) == sorted([hidden * 4, 4, 4])
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
