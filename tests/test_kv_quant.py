"""KV cache quantization (attention_mode % 8, as MNN numbers it): 1 stores keys as int8, 2 keys
and values (values only with flash attention, attention_mode >= 8, as MNN's CPU attention does).

Truths: attention over keys and values quantized here in numpy (one symmetric scale per head and
token, written apart from the engine); MNN's own int8 KV error on the same prompts, run live."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from mnngpu.backend import BackendConfig, Node
from mnngpu.backend.kv import KVMeta
from mnngpu.backends.cpu import CPUBackend
from mnngpu.errors import ConfigError
from mnngpu.format import params as P
from tests import reference
from tests.backend.harness import run
from tests.reference_model import MODEL_DIR, load_model

ORACLE = MODEL_DIR.parents[2] / "mnn_oracle.py"


def int8_round_trip(x: np.ndarray) -> np.ndarray:
    """x [tokens, kv_heads, dim] through int8 codes with one scale s = max|x|/127 per token and
    head: codes round-half-even(x * (1/s)), float32 arithmetic throughout."""
    x = x.astype(np.float32)
    scale = np.max(np.abs(x), axis=-1, keepdims=True) / np.float32(127)
    inverse = np.float32(1) / np.where(scale > 0, scale, np.float32(1))
    codes = np.clip(np.round(x * inverse), -127, 127)
    return (codes * scale).astype(np.float32)


@pytest.mark.parametrize("kv_quant, window", [(1, 0), (2, 0), (2, 4)])
def test_attention_over_an_int8_cache_is_attention_over_the_rounded_keys(kv_quant, window):
    rng = np.random.default_rng(4)
    heads, kv_heads, dim = 4, 2, 16
    backend = CPUBackend(BackendConfig(precision="high", thread_num=2, kv_quant=kv_quant), KVMeta())
    meta = backend.kv_meta
    node = Node("Attention", "attn", P.AttentionParam(layer_index=0, output_c4=True))
    keys, values = [], []
    for seq in (9, 1, 1):   # a prefill, then two decode steps
        q = rng.normal(0, 1, (1, seq, heads, dim)).astype(np.float32)
        k = rng.normal(0, 1, (1, seq, kv_heads, dim)).astype(np.float32)
        v = rng.normal(0, 1, (seq, kv_heads * dim, 1, 1)).astype(np.float32)
        meta.add = seq
        mask = np.full((1, 1, 1, 1), window, np.float32)   # a sliding layer's key window (0: none)
        got = run(backend, node, [q, k, v, mask], host=(3,)).reshape(seq, heads, dim)
        past = meta.previous
        meta.sync()
        keys.append(int8_round_trip(k[0]))
        v = v.reshape(seq, kv_heads, dim)
        values.append(int8_round_trip(v) if kv_quant == 2 else v)
        want = reference.causal_attention(q[0], np.concatenate(keys), np.concatenate(values), past, 1 / np.sqrt(dim),
                                          window)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    cache = backend.kv_caches[0]
    assert cache.k.dtype == np.int8 and cache.v.dtype == (np.int8 if kv_quant == 2 else np.float32)


def mnn_first_logits(texts: list[str], mode: int, tmp_path) -> np.ndarray:
    pytest.importorskip("MNN")
    out = tmp_path / f"mnn{mode}.npy"
    subprocess.run([sys.executable, str(ORACLE), str(MODEL_DIR), "--prompts-json", json.dumps(texts), "--steps", "1",
                    "--config-json", json.dumps({"attention_mode": mode}), "--json-out", str(tmp_path / "r.json"),
                    "--logits-out", str(out)], check=True, capture_output=True, timeout=300)
    return np.load(out)


@pytest.mark.parametrize("mode, kv_quant", [(9, 1), (10, 2), (2, 1)])
def test_int8_kv_stays_within_mnns_own_int8_error_and_saves_memory(tmp_path, mode, kv_quant):
    """Tolerance: per prompt, the error against float KV (max |diff| / std of the logits) is at most
    1.5x MNN's own error with the same attention_mode plus 0.01."""
    prompts = json.loads((MODEL_DIR / "reference.json").read_text())["prompts"]
    texts = [p["text"] for p in prompts]
    exact = np.load(MODEL_DIR / "first_logits.npy")            # MNN with float KV
    mnn = mnn_first_logits(texts, mode, tmp_path)
    model = load_model(attention_mode=mode)
    assert model.runtime.schedule.backend_config.kv_quant == kv_quant
    for i, prompt in enumerate(prompts):
        model.reset()
        got = np.asarray(model.forward(prompt["ids"]))[0, -1]
        ours = np.abs(got - exact[i]).max() / exact[i].std()
        theirs = np.abs(mnn[i] - exact[i]).max() / exact[i].std()
        assert ours <= 1.5 * theirs + 0.01, (prompt["text"], ours, theirs)
    cache = model.runtime.backend().kv_caches[0]
    kv_heads, capacity, dim = cache.k.shape
    value_bytes = dim if kv_quant == 2 else 4 * dim
    assert cache.nbytes == kv_heads * capacity * (dim + 4 + value_bytes + 4)   # codes, scales per head and token
    assert cache.nbytes < kv_heads * capacity * dim * 4 * 2     # float32 keys and values


def check_padded_prefill_then_decode(backend, kv_quant: int, rtol: float, half_values: bool = False,
                                     window: int = 0) -> None:
    """A padded prefill (8 rows, 5 real) then decode steps through one Attention op on a device
    backend with an int8 KV cache, against numpy attention over the same int8 rounding; with a
    key window (a sliding layer's), one that cuts every row past the third."""
    from tests.backend.harness import OneOp

    backend.config.kv_quant = kv_quant
    rng = np.random.default_rng(10 + kv_quant)
    heads, kv_heads, dim, real, padded = 4, 2, 16, 5, 8
    node = Node("Attention", "attn", P.AttentionParam(layer_index=0, output_c4=False))

    def inputs(q, k, v):
        seq = len(q)
        return [q.reshape(1, seq, heads, dim), k.reshape(1, seq, kv_heads, dim), v.reshape(seq, kv_heads * dim, 1, 1),
                np.full((1, 1, 1, 1), window, np.float32)]

    total = real + 2
    q, k, v = (rng.standard_normal((total, h, dim)).astype(np.float32) for h in (heads, kv_heads, kv_heads))
    pad = np.full((padded - real, 1, 1), 9.0, np.float32)
    prefill_in = inputs(*(np.concatenate([a[:real], pad * np.ones_like(a[:1])]) for a in (q, k, v)))
    prefill = OneOp(backend, node, prefill_in, host=(3,))
    decode = OneOp(backend, node, inputs(q[:1], k[:1], v[:1]), host=(3,))
    keys = int8_round_trip(k)
    values = int8_round_trip(v) if kv_quant == 2 else v
    if half_values and kv_quant == 1:
        values = values.astype(np.float16).astype(np.float32)
    meta = backend.kv_meta
    meta.add = real
    got = prefill(*prefill_in)[0].reshape(padded, heads, dim)[:real]
    meta.sync()
    want = reference.causal_attention(q[:real], keys[:real], values[:real], 0, 1 / np.sqrt(dim), window)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    for t in range(real, total):
        meta.add = 1
        got = decode(*inputs(q[t:t + 1], k[t:t + 1], v[t:t + 1]))[0].reshape(1, heads, dim)
        meta.sync()
        want = reference.causal_attention(q[t:t + 1], keys[:t + 1], values[:t + 1], t, 1 / np.sqrt(dim), window)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("variant, precision, kv_quant, window", [
    ("cpu", "high", 2, 0), ("gpu", "high", 1, 0), ("cpu", "low", 1, 0), ("gpu", "low", 2, 0), ("cpu", "high", 2, 3),
    ("gpu", "high", 1, 3)])
def test_vulkan_attention_over_an_int8_cache(variant, precision, kv_quant, window):
    """Both Vulkan kernel families (lavapipe); values kept as stored, fp16 at precision low, in mode 1."""
    from tests.backend.test_vulkan_ops import make_backend
    from tests.conftest import backend_or_skip

    backend_or_skip("vulkan")
    from mnngpu.backends.vulkan import VulkanBackend

    backend = make_backend(VulkanBackend, precision, variant=variant)
    check_padded_prefill_then_decode(backend, kv_quant, 1e-4 if precision == "high" else 3e-3,
                                     half_values=precision == "low", window=window)


def test_vulkan_int8_kv_gives_the_cpu_int8_kv_logits():
    from tests.conftest import backend_or_skip

    backend_or_skip("vulkan")
    ids = json.loads((MODEL_DIR / "reference.json").read_text())["prompts"][1]["ids"]
    want = np.asarray(load_model(attention_mode=10).forward(ids))[0, -1]
    got = np.asarray(load_model(attention_mode=10, backend_type="vulkan").forward(ids))[0, -1]
    assert np.abs(got - want).max() < 1e-3 * want.std()


def test_a_backend_without_kv_quantization_is_a_config_error_naming_it():
    from mnngpu.config import LlmConfig
    from mnngpu.runtime.schedule import RuntimeManager

    config = LlmConfig.load(MODEL_DIR)
    config.set_config({"backend_type": "cuda", "attention_mode": 10})
    with pytest.raises(ConfigError, match="cuda") as caught:
        RuntimeManager.from_config(config)
    assert caught.value.field == "attention_mode"


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
@pytest.mark.parametrize("kv_quant, window", [(1, 0), (2, 0), (1, 3)])
def test_opencl_attention_over_an_int8_cache(variant, kv_quant, window):
    """Both OpenCL kernel families (PoCL)."""
    from tests.backend.test_opencl_ops import make_backend

    check_padded_prefill_then_decode(make_backend(variant), kv_quant, 1e-4, window=window)


def test_a_read_int8_cache_written_back_keeps_its_codes_and_scales():
    """What a device cache's read() gives (codes times scales, float32) and write() codes again: the
    same codes and scales, though max|x| / 127 misses some rows' scale by a unit in the last place."""
    from mnngpu.backend.kv import quantize_int8, requantize_int8

    rng = np.random.default_rng(3)
    codes = rng.integers(-127, 128, size=(2, 400, 64)).astype(np.int8)
    codes[..., 0] = 127   # quantize_int8 gives every row a code of +-127
    scale = (rng.random((2, 400)) * 0.05 + 1e-3).astype(np.float32)
    decoded = codes.astype(np.float32) * scale[..., None]
    again_codes, again_scale = requantize_int8(decoded)
    assert np.array_equal(again_codes, codes) and np.array_equal(again_scale, scale)
    assert not np.array_equal(quantize_int8(decoded)[1], scale)   # the plain coding misses some rows
