"""Continuous batching on the fixed-shape device backends (vulkan, opencl, cuda): several sequences'
decode rows in one forward of a fixed-width module. Each greedy reply is the one its prompt gets
alone, and each sequence's KV cache holds what running alone leaves in it (the idle rows store
nothing). On Vulkan and CUDA, whose recorded commands (a CUDA graph) bind one pool per layer with a
region per sequence, slots come back when a batch is dropped; on Vulkan more sequences than a
buffer holds is a clear error. Without a backend's device its tests skip with the reason
(tests.conftest.backend_or_skip); tests/backend/test_batch_cuda.py has CUDA's own."""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from mnngpu.errors import ConfigError
from mnngpu.generation.batch import Batch
from tests.conftest import FIXTURES, backend_or_skip

DEMO = FIXTURES.parents[2] / "mnngpu" / "demo" / "model"
GQA = FIXTURES / "qwen2_int4_b64"   # 4 query heads over 2 kv heads
QUESTIONS = ("Once upon a time", "Tell me about crows.", "Why is the sky blue?", "What colour is grass?",
             "Write a story about a dog who found a red ball in the park.", "Hello!")
NEW_TOKENS = 12


def load(folder, backend="vulkan", **overrides):
    backend_or_skip(backend)
    model = mnngpu_llm.create(folder)
    model.set_config({"backend_type": backend, "precision": "high", "thread_num": 2, "sampler_type": "greedy",
                      **overrides})
    model.load()
    return model


def prompt_ids(model) -> list[list[int]]:
    """Prompts of different lengths."""
    return [model.tokenizer_encode(model.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS]


def caches(model) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Every layer's keys and values the current sequence holds on the device."""
    backend = model.runtime.backend()
    backend.finish()
    length = model.runtime.kv_meta.previous
    return {layer: cache.read(length) for layer, cache in sorted(backend.kv_caches.items())}


def run_alone(model, ids) -> tuple[list[int], dict]:
    model.reset()
    tokens = model.generate(ids, NEW_TOKENS, stop_ids=())
    return tokens, caches(model)


# cuda has no int8 KV cache (attention_mode 10 is a ConfigError there)
CASES = [(backend, folder, mode) for backend in ("vulkan", "opencl", "cuda")
         for folder, mode in ((DEMO, 8), (GQA, 8), (GQA, 10)) if not (backend == "cuda" and mode == 10)]


@pytest.mark.parametrize("backend, folder, attention_mode", CASES,
                         ids=[f"{b}-{'demo' if f == DEMO else 'gqa'}{'-int8-kv' if m == 10 else ''}"
                              for b, f, m in CASES])
def test_batched_greedy_replies_and_caches_are_each_prompts_alone(backend, folder, attention_mode):
    model = load(folder, backend, attention_mode=attention_mode)
    ids = prompt_ids(model)
    expected = [run_alone(model, i) for i in ids]
    model.reset()
    batch = Batch(model, slots=4)   # more prompts than slots: the last two wait for a free one
    requests = [batch.submit(i, max_new_tokens=NEW_TOKENS, stop_ids=()) for i in ids]
    batch.run()
    for (tokens, _), request in zip(expected, requests):
        assert request.error is None and request.tokens == tokens
    # a sequence's cache is read back where no later request reused its slot
    last_on = {id(r.sequence): r for r in requests}
    for (_, want), request in zip(expected, requests):
        if last_on[id(request.sequence)] is not request:
            continue
        model.use_sequence(request.sequence)
        got = caches(model)
        assert got.keys() == want.keys()
        for layer in want:
            for side in (0, 1):
                np.testing.assert_allclose(got[layer][side], want[layer][side], rtol=1e-4, atol=1e-4)


POOLED = ["vulkan", "cuda"]   # one KV pool per layer, a region per sequence


@pytest.mark.parametrize("backend", POOLED)
def test_idle_rows_store_nothing(backend):
    """One sequence decoding in a 4-row module: the 3 idle rows leave every other slot's region as
    it was (zeroed first), and the live row's cache is the one generate() leaves."""
    model = load(DEMO, backend)
    ids = prompt_ids(model)[0]
    want_tokens, want = run_alone(model, ids)
    batch = Batch(model, slots=4)
    backend = model.runtime.backend()
    others = []
    for sequence in batch.sequences[1:]:   # give the other slots a cache each, all zeros
        model.use_sequence(sequence)
        model.reset()
        model.forward(ids[:3])
        for cache in backend.kv_caches.values():
            cache.reset()
        others.append(dict(backend.kv_caches))
    request = batch.submit(ids, max_new_tokens=NEW_TOKENS, stop_ids=(), sequence=batch.sequences[0])
    model.use_sequence(batch.sequences[0])
    model.reset()
    batch.run()
    assert request.tokens == want_tokens
    model.use_sequence(request.sequence)
    for layer, (keys, values) in caches(model).items():
        np.testing.assert_allclose(keys, want[layer][0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(values, want[layer][1], rtol=1e-4, atol=1e-4)
    capacity = backend.kv_pools[0].capacity
    for held in others:
        for cache in held.values():
            keys, values = cache.read(capacity)
            assert not keys.any() and not values.any()


@pytest.mark.parametrize("backend", POOLED)
def test_slots_come_back_when_a_batch_is_dropped(backend):
    model = load(DEMO, backend)
    ids = prompt_ids(model)[:4]
    backend = model.runtime.backend()
    for _ in range(2):
        batch = Batch(model, slots=4)
        for i in ids:
            batch.submit(i, max_new_tokens=2, stop_ids=())
        batch.run()
        del batch
        model.use_sequence(model.new_sequence())   # let go of the last batch's sequences
    assert backend.slots == 4


def test_more_vulkan_sequences_than_one_buffer_holds_is_a_clear_error():
    model = load(DEMO)
    ids = prompt_ids(model)[0]
    backend = model.runtime.backend()
    model.generate(ids, 1, stop_ids=())
    slot_bytes = max(pool.slot_bytes for pool in backend.kv_pools.values())
    backend.max_binding_bytes = 2 * slot_bytes   # as if the device's buffers held two sequences' caches
    batch = Batch(model, slots=3)
    requests = [batch.submit(ids, max_new_tokens=2, stop_ids=()) for _ in range(3)]
    batch.run()
    failed = [r.error for r in requests if r.error is not None]
    assert len(failed) == 1 and isinstance(failed[0], ConfigError)
    assert failed[0].field == "parallel" and "max_all_tokens" in str(failed[0])
