"""The CUDA backend's host side on a machine without a GPU, through the cupy stand-in of
tests/backend/cuda_offline.py: every launch the backend prepares for a whole model, in one
sequence's modules and a batched decode module, matches its kernel's signature; and continuous
batching's bookkeeping (a slot per sequence in each layer's pool, the rows table, idle rows, the
pools growing, the CUDA graph captured and captured again) gives each sequence's rows the
attention and the KV cache the reference gives that sequence alone.

The kernels themselves are not run here (test_cuda_kernels_compile.py compiles them; the GPU tests
run them): the stand-in computes the two KV-cache kernels in numpy, as attention.cu does.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from mnngpu.backend import Node
from mnngpu.backend.kv import KVMeta, Segment, Sequence
from mnngpu.backend.sequences import enter
from mnngpu.errors import ConfigError, InputError
from mnngpu.generation.batch import Batch
from tests import reference
from tests.backend import cuda_offline
from tests.backend.harness import OneOp, _cuda
from tests.conftest import FIXTURES

DEMO = FIXTURES.parents[2] / "mnngpu" / "demo" / "model"
rng = np.random.default_rng(5)


@pytest.fixture(autouse=True)
def offline_cupy(monkeypatch, tmp_path):
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "cupy", cuda_offline.fake_cupy())
    cuda_offline.Stream.capturing = None


def kernels(backend) -> dict:
    return {name: kernel for module in backend.device._modules.values() for name, kernel in module.kernels.items()}


def test_every_launch_of_a_model_matches_its_kernel_signature():
    """Prefill, decode (captured into a graph) and a batched decode of three sequences in a 4-row
    module (its linear layers on the *_tokens GEMVs): each launch is checked as it is made
    (cuda_offline.Kernel.check). The slots the batch takes grow every pool, and the decode graph is
    captured again over the new arrays."""
    model = mnngpu_llm.create(DEMO)
    model.set_config({"backend_type": "cuda", "precision": "high", "sampler_type": "greedy"})
    model.load()
    backend = model.runtime.backend()
    model.forward(model.tokenizer_encode("Once upon a time"))
    for _ in range(3):
        model.forward([1])
    decode, = [r for r in backend.graphs.recordings if r.graph is not None]
    batch = Batch(model, slots=4)
    for _ in range(3):
        model.decode_rows(batch.sequences[:3], [1, 2, 3])
    assert backend.slots == 4 and all(pool.slots == 4 for pool in backend.kv_pools.values())
    assert decode.graph is None   # the pools it bound were replaced
    rows, = [r for r in backend.graphs.recordings if any(getattr(e, "batched", False) for e in r.executions)]
    assert rows.graph is not None   # the batched module's launches (GEMVs too) are captured
    for _ in range(2):
        model.forward([1])
    bound = {id(arg) for _, (_, _, args) in decode.graph.launches for arg in args}
    assert all(id(pool.k) in bound and id(pool.v) in bound for pool in backend.kv_pools.values())
    launched = {name for name, kernel in kernels(backend).items() if kernel.launches}
    assert {"kv_append", "attention", "layer_norm", "real_to_gemm", "gemm_to_real"} <= launched
    assert any(name.startswith("gemv_") and not name.endswith("_tokens") for name in launched)
    assert any(name.startswith("gemv_") and name.endswith("_tokens") for name in launched)


@pytest.mark.parametrize("name", ["qwen3_c4", "phi2_c4"])
def test_a_c4_export_runs_its_fused_layer_on_the_device(name):
    """MNN's newer export (FusedLinear with its norm, RoPE with q/k norm or a partial rotary): the
    residual norms (an add and a layer_norm launch) and the rotary (rope_rotate_half) run as CUDA
    launches whose arguments match their kernels, none on the CPU backup."""
    model = mnngpu_llm.create(FIXTURES / name)
    model.set_config({"backend_type": "cuda", "precision": "high"})
    model.load()
    model.forward(model.tokenizer_encode("hello"))
    model.forward([1])
    fallen = {p.op_type for p in model.runtime.placements.fallbacks}
    assert not fallen & {"LayerNorm", "fused.RoPE"}, fallen
    launched = {name for name, kernel in kernels(model.runtime.backend()).items() if kernel.launches}
    assert {"rope_rotate_half", "layer_norm", "binary_same"} <= launched


# ---- one Attention op, several sequences ------------------------------------------------------------------

HEADS, KV_HEADS, DIM = 4, 2, 8


class History:
    """One sequence's keys and values so far (the reference's), and its caches' KVMeta."""

    def __init__(self):
        self.sequence = Sequence(KVMeta())
        self.keys = np.zeros((0, KV_HEADS, DIM), np.float32)
        self.values = np.zeros_like(self.keys)

    def want(self, q, k, v) -> np.ndarray:
        """The reference attention of new rows q (rows, heads, dim) after this history, kept."""
        past = len(self.keys)
        self.keys, self.values = np.concatenate([self.keys, k]), np.concatenate([self.values, v])
        return reference.causal_attention(q, self.keys, self.values, past, 1 / np.sqrt(DIM))


def attention_module(backend, rows: int) -> OneOp:
    node = Node("Attention", "attn", SimpleNamespace(kv_cache=True, layer_index=0, output_c4=False, attnScale=0.0))
    return OneOp(backend, node, inputs(rows))


def inputs(rows: int) -> list[np.ndarray]:
    return [rng.standard_normal((1, rows, HEADS, DIM)).astype(np.float32),
            rng.standard_normal((1, rows, KV_HEADS, DIM)).astype(np.float32),
            rng.standard_normal((rows, KV_HEADS * DIM, 1, 1)).astype(np.float32),
            np.zeros((1, 1, 1, 1), np.float32)]


def alone(backend, module: OneOp, history: History, real: int) -> None:
    """A forward of `real` rows of one sequence (padded to the module's rows), checked."""
    enter(backend, history.sequence)
    rows = module.inputs[0].shape[1]
    q, k, v, mask = inputs(rows)
    history.sequence.meta.add = real
    got = module(q, k, v, mask)[0].reshape(rows, HEADS, DIM)[:real]
    want = history.want(q[0, :real], k[0, :real], v[:real].reshape(real, KV_HEADS, DIM))
    history.sequence.meta.sync()
    reference.assert_close(got, want, 1e-5)


def batched(backend, module: OneOp, histories: list[History | None]) -> np.ndarray:
    """One batched forward, row r for histories[r] (None: an idle row), checked; the output rows."""
    rows = len(histories)
    q, k, v, mask = inputs(rows)
    segments = [Segment(h.sequence, r, 1) for r, h in enumerate(histories) if h is not None]
    for segment in segments:
        segment.sequence.meta.add = 1
    backend.batch = segments
    try:
        got = module(q, k, v, mask)[0].reshape(rows, HEADS, DIM)
    finally:
        backend.batch = None
    for r, history in enumerate(histories):
        if history is not None:
            want = history.want(q[0, r: r + 1], k[0, r: r + 1], v[r: r + 1].reshape(1, KV_HEADS, DIM))
            reference.assert_close(got[r: r + 1], want, 1e-5)
            history.sequence.meta.sync()
    return got


def cache_of(backend, history: History):
    return history.sequence.caches_on(backend)[0][0]


def test_batched_rows_attend_to_their_own_sequence_and_idle_rows_store_nothing():
    backend = _cuda("fp32")
    backend.max_tokens = 32
    prefill = attention_module(backend, 6)
    a, b, c = History(), History(), History()
    for history, real in ((a, 5), (b, 2), (c, 6)):
        alone(backend, prefill, history, real)
    assert backend.slots >= 3 and sorted(cache_of(backend, h).slot.index for h in (a, b, c)) == [0, 1, 2]
    backend.batch = [Segment(a.sequence, 0, 1)]   # the batched module is resized inside a batched forward
    module = attention_module(backend, 4)
    backend.batch = None
    recording = backend.graphs.recordings[-1]
    for step in range(4):   # row 1 idle; from the second run on, the captured graph replays
        out = batched(backend, module, [c, None, a, b])
        assert not out[1].any()
        assert (recording.graph is not None) == (step >= 1)
    assert recording.graph.replays == 3   # captured in the second run, launched in the last three
    for history in (a, b, c):
        cache = cache_of(backend, history)
        keys, values = cache.read(cache.capacity)
        length = len(history.keys)
        np.testing.assert_array_equal(keys[:, :length], history.keys.transpose(1, 0, 2))
        np.testing.assert_array_equal(values[:, :length], history.values.transpose(1, 0, 2))
        assert not keys[:, length:].any() and not values[:, length:].any()   # nothing past its own rows
    alone(backend, prefill, b, 1)   # one sequence's forward after batched ones continues its cache


def test_a_new_sequence_grows_the_pools_and_the_graph_is_captured_again():
    backend = _cuda("fp32")
    backend.max_tokens = 16
    prefill = attention_module(backend, 3)
    a, b = History(), History()
    for history in (a, b):
        alone(backend, prefill, history, 3)
    backend.batch = [Segment(a.sequence, 0, 1)]
    module = attention_module(backend, 3)
    backend.batch = None
    recording = backend.graphs.recordings[-1]
    for _ in range(2):
        batched(backend, module, [a, b, None])
    old_graph, old_pool = recording.graph, backend.kv_pools[0].k
    assert old_graph is not None and backend.slots == 2
    c = History()   # a third sequence: no free slot, so every pool doubles
    alone(backend, prefill, c, 2)
    assert backend.slots == 4 and backend.kv_pools[0].k is not old_pool and recording.graph is None
    for _ in range(2):
        batched(backend, module, [b, c, a])
    assert recording.graph is not None and recording.graph is not old_graph


def test_a_dropped_sequence_gives_its_slot_back():
    backend = _cuda("fp32")
    prefill = attention_module(backend, 2)
    a, b = History(), History()
    alone(backend, prefill, a, 2)
    alone(backend, prefill, b, 2)
    enter(backend, Sequence(KVMeta()))
    slot = cache_of(backend, b).slot.index
    del b
    c = History()
    alone(backend, prefill, c, 1)
    assert cache_of(backend, c).slot.index == slot and backend.slots == 2


def test_the_cache_grows_past_its_capacity_for_every_slot():
    backend = _cuda("fp32")
    backend.max_tokens = 4   # a capacity of 4 (prefill_len 0)
    prefill = attention_module(backend, 6)
    a, b = History(), History()
    alone(backend, prefill, a, 6)
    alone(backend, prefill, b, 6)
    alone(backend, prefill, a, 6)
    assert backend.kv_pools[0].capacity >= 12
    for history in (a, b):
        keys, _ = cache_of(backend, history).read(len(history.keys))
        np.testing.assert_array_equal(keys, history.keys.transpose(1, 0, 2))


def test_a_prefix_written_past_the_capacity_is_refused_by_name():
    backend = _cuda("fp32")
    backend.max_tokens = 4
    attention_module(backend, 2)
    cache = backend.kv_cache(0, KV_HEADS, DIM)
    with pytest.raises(InputError) as refused:
        cache.write(np.zeros((KV_HEADS, 9, DIM), np.float32), np.zeros((KV_HEADS, 9, DIM), np.float32))
    assert refused.value.field == "max_all_tokens"


def test_more_sequences_than_the_device_memory_holds_is_a_clear_error(monkeypatch):
    backend = _cuda("fp32")
    prefill = attention_module(backend, 2)
    a, b = History(), History()
    alone(backend, prefill, a, 2)
    alone(backend, prefill, b, 2)
    zeros = sys.modules["cupy"].zeros

    def out_of_memory(shape, dtype):
        if len(shape) == 4 and shape[0] > 2:
            raise MemoryError("out of memory allocating a pool")
        return zeros(shape, dtype)

    monkeypatch.setattr(sys.modules["cupy"], "zeros", out_of_memory)
    with pytest.raises(ConfigError) as refused:
        alone(backend, prefill, History(), 1)
    assert refused.value.field == "parallel" and "--parallel" in str(refused.value)
    alone(backend, prefill, a, 1)   # the sequences that fit go on
