"""The server's prompt cache across requests and slots (cache_ram, mnngpu/engine/block_cache.py,
mnngpu/apps/server/prompt_blocks.py).

Truths: the replies of the same server with the cache off (greedy, token for token); the prompt's
token ids from HuggingFace `tokenizers` with the HF chat template (tests/reference_model.py), from
which the hits a request must get are counted apart from the cache's code; numpy byte sizes for the
budget; the Prometheus text of /metrics, parsed by prometheus_client's parser."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from prometheus_client.parser import text_string_to_metric_families

from mnngpu import llm as llm_module
from mnngpu.apps.server.app import create_app
from mnngpu.apps.server.engine import ServedModel
from mnngpu.engine.block_cache import BLOCK_TOKENS, Block, BlockCache, chain_hashes
from mnngpu.errors import ConfigError
from tests.conftest import FIXTURES, backend_or_skip
from tests.reference_model import ORACLE_CONFIG, hf_render, hf_tokenizer
from tests.serving import openai_client, running

NAME = "fixture-model"
SYSTEM = " ".join(f"Rule {i}: the farmer keeps {i} cows in barn {i % 7}." for i in range(30))   # ~900 tokens
OTHER_SYSTEM = " ".join(f"Note {i}: the river floods field {i % 5} in year {1900 + i}." for i in range(30))
QUESTIONS = ["Who is the farmer?", "What is in the barn?", "hello", "Tell me a story.", "Who feeds the cows?",
             "How many cows?", "Where is barn 3?", "Name a rule."]


def messages(question: str, system: str = SYSTEM) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def load(model: str = "qwen2_int4_b64", **overrides):
    llm = llm_module.create(FIXTURES / model / "config.json")
    llm.set_config({**ORACLE_CONFIG, "sampler_type": "greedy", **overrides})
    llm.load()
    return llm


def ask(api, question: str, system: str = SYSTEM):
    """The reply's text, its cached prompt tokens and each reply token's log-probability."""
    reply = api.chat.completions.create(model=NAME, messages=messages(question, system), max_tokens=12,
                                        temperature=0, logprobs=True)
    choice = reply.choices[0]
    return (choice.message.content, reply.usage.prompt_tokens_details.cached_tokens,
            [entry.logprob for entry in choice.logprobs.content])


def assert_same_replies(cached, without, tolerance: float = 2e-4):
    """Token-identical texts, and each token's log-probability as close as a prefill's rounding
    leaves it (a cached start's keys and values are the ones a prefill of it computed)."""
    assert [r[0] for r in cached] == [r[0] for r in without]
    for got, want in zip(cached, without):
        np.testing.assert_allclose(got[2], want[2], atol=tolerance)


def replies(model: str, backend: str, cache_mib: int, parallel: int, asks: list[tuple[str, str]],
            concurrent: bool, **overrides):
    """Each (question, system)'s ask(), the /metrics text after them, and the ServedModel."""
    served = ServedModel(load(model, backend_type=backend, cache_ram=cache_mib, **overrides), NAME,
                         parallel=parallel)
    try:
        with running(create_app(served)) as client:
            api = openai_client(client)
            if concurrent:
                with ThreadPoolExecutor(len(asks)) as clients:
                    out = list(clients.map(lambda pair: ask(api, *pair), asks))
            else:
                out = [ask(api, *pair) for pair in asks]
            return out, client.get("/metrics").text, served
    finally:
        served.close()


def metric(text: str, name: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return None


def hf_ids(question: str, system: str = SYSTEM) -> list[int]:
    return hf_tokenizer().encode(hf_render(messages(question, system))).ids


def expected_hits(prompts: list[list[int]], checkpoint: int = 1) -> list[int]:
    """The tokens each of `prompts`, asked one after another, must find cached: the whole blocks its
    start shares with an earlier prompt (that prompt stored every whole block but its last id's),
    cut to a multiple of `checkpoint` blocks where a model resumes only at checkpoints."""
    hits = []
    for index, ids in enumerate(prompts):
        best = 0
        for earlier in prompts[:index]:
            common = next((i for i, (a, b) in enumerate(zip(ids, earlier)) if a != b), min(len(ids), len(earlier)))
            stored = (len(earlier) - 1) // BLOCK_TOKENS
            best = max(best, min(common // BLOCK_TOKENS, stored, (len(ids) - 1) // BLOCK_TOKENS))
        hits.append(best // checkpoint * checkpoint * BLOCK_TOKENS)
    return hits


# ---- the block cache alone ---------------------------------------------------------------------
def _block(fill: float, states: bool = False) -> Block:
    keys = np.full((2, BLOCK_TOKENS, 4), fill, dtype=np.float32)
    state = {"layer": {"conv": np.zeros((3, 2), dtype=np.float32)}} if states else None
    return Block({0: (keys, keys.copy())}, state)


def test_a_blocks_name_stands_for_the_whole_prefix_before_it():
    ids = list(range(3 * BLOCK_TOKENS))
    changed_last = ids[:-1] + [9999]
    changed_first = [9999] + ids[1:]
    names = chain_hashes(ids, 3)
    assert chain_hashes(changed_last, 3)[:2] == names[:2] and chain_hashes(changed_last, 3)[2] != names[2]
    assert all(a != b for a, b in zip(chain_hashes(changed_first, 3), names))


def test_least_recently_used_blocks_go_first_deepest_first():
    size = _block(0).nbytes
    cache = BlockCache(budget=3 * size, needs_states=False)
    first = chain_hashes(list(range(3 * BLOCK_TOKENS)), 3)
    second = chain_hashes(list(range(100, 100 + 2 * BLOCK_TOKENS)), 2)
    cache.store(first, [_block(i) for i in range(3)])
    cache.store(second, [_block(10 + i) for i in range(2)])
    assert cache.nbytes == 3 * size == sum(b.nbytes for b in cache.blocks.values())
    assert cache.counts.evicted_blocks == 2
    found = cache.lookup(first)   # the chain's tail went, its start stays
    assert len(found) == 1 and float(found[0].layers[0][0][0, 0, 0]) == 0.0
    assert len(cache.lookup(second)) == 2


def test_a_recurrent_model_resumes_only_at_a_state_checkpoint():
    cache = BlockCache(budget=1 << 30, needs_states=True)
    names = chain_hashes(list(range(5 * BLOCK_TOKENS)), 5)
    cache.store(names, [_block(i, states=i == 1) for i in range(5)])
    assert len(cache.lookup(names)) == 2


def test_a_request_waits_for_the_blocks_another_computes():
    cache = BlockCache(budget=1 << 30, needs_states=False)
    names = chain_hashes(list(range(2 * BLOCK_TOKENS)), 2)
    claim = cache.claim(names)
    assert claim is not None and cache.claim(names[1:]) is None
    waiter = threading.Thread(target=cache.wait_for, args=(names,))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()
    cache.store(names, [_block(0), _block(1)])
    cache.release(claim)
    waiter.join(10)
    assert not waiter.is_alive() and len(cache.lookup(names)) == 2


# ---- served --------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["cpu", "opencl", "vulkan"])
def test_concurrent_requests_sharing_a_system_prompt_get_the_replies_of_no_cache(backend):
    if backend != "cpu":
        backend_or_skip(backend)
    asks = [(q, SYSTEM) for q in QUESTIONS]
    without, _, _ = replies("qwen2_int4_b64", backend, 0, 4, asks, concurrent=True)
    cached, text, _ = replies("qwen2_int4_b64", backend, 64, 4, asks, concurrent=True)
    assert_same_replies(cached, without)
    assert all(r[1] == 0 for r in without)
    shared = expected_hits([hf_ids(q) for q in QUESTIONS[:2]])[1]
    # every request but the one that computed the system prompt's blocks finds them
    assert sum(r[1] >= shared for r in cached) >= len(QUESTIONS) - 1
    assert metric(text, "mnngpu_prefix_cache_hits_total") == sum(r[1] for r in cached)


def test_metrics_count_queried_and_hit_prompt_tokens():
    asks = [(QUESTIONS[0], SYSTEM), (QUESTIONS[1], SYSTEM), (QUESTIONS[0], OTHER_SYSTEM), (QUESTIONS[2], SYSTEM)]
    prompts = [hf_ids(q, s) for q, s in asks]
    out, text, _ = replies("qwen2_int4_b64", "cpu", 64, 2, asks, concurrent=False)
    hits = expected_hits(prompts)
    assert [r[1] for r in out] == hits and hits[1] > 0
    assert metric(text, "mnngpu_prefix_cache_queries_total") == sum(map(len, prompts))
    assert metric(text, "mnngpu_prefix_cache_hits_total") == sum(hits)
    assert metric(text, "mnngpu_prompt_cached_tokens_total") == sum(hits)


def test_a_tiny_budget_evicts_and_the_replies_stay_those_of_no_cache():
    asks = [(QUESTIONS[0], SYSTEM), (QUESTIONS[0], OTHER_SYSTEM), (QUESTIONS[1], SYSTEM), (QUESTIONS[1], OTHER_SYSTEM)]
    without, _, _ = replies("qwen2_int4_b64", "cpu", 0, 1, asks, concurrent=False)
    cached, text, served = replies("qwen2_int4_b64", "cpu", 1, 1, asks, concurrent=False)
    assert_same_replies(cached, without)
    cache = served.slots.prompt_blocks.cache
    assert cache.counts.evicted_blocks > 0 and 0 < cache.nbytes <= 1 << 20
    assert metric(text, "mnngpu_prefix_cache_bytes") == cache.nbytes


@pytest.mark.parametrize("model", ["qwen3_5_int4_b64", "lfm2_int4_b64"])
def test_a_recurrent_model_reuses_prefixes_from_its_state_checkpoints(model):
    from mnngpu.apps.server.prompt_blocks import CHECKPOINT_BLOCKS

    asks = [(q, SYSTEM) for q in QUESTIONS[:3]]
    without, _, _ = replies(model, "cpu", 0, 2, asks, concurrent=False)
    cached, _, _ = replies(model, "cpu", 64, 2, asks, concurrent=False)
    assert_same_replies(cached, without)
    hits = [r[1] for r in cached]
    assert hits[0] == 0 and hits[1] > 0 and all(h % (CHECKPOINT_BLOCKS * BLOCK_TOKENS) == 0 for h in hits)


@pytest.mark.parametrize("model, setting", [("qwen2_int4_b64", "chunk"), ("qwen2_eagle3_int4", "speculative"),
                                            ("qwen2_int4_b64", "prefix_cache_path")])
def test_the_cache_keeps_the_replies_with_chunked_prefill_speculative_decoding_and_prefix_files(
        model, setting, tmp_path):
    overrides = {"chunk": {"chunk": 48}, "speculative": {},
                 "prefix_cache_path": {"prefix_cache_path": str(tmp_path)}}[setting]
    asks = [(q, SYSTEM) for q in QUESTIONS[:3]]
    without, _, _ = replies(model, "cpu", 0, 1, asks, concurrent=False, **overrides)
    cached, _, _ = replies(model, "cpu", 64, 1, asks, concurrent=False, **overrides)
    assert_same_replies(cached, without)
    if setting != "prefix_cache_path":   # there the prefix file gives the system turn, read from disk
        assert [r[1] > 0 for r in cached] == [False, True, True]


def test_a_backend_that_cannot_read_its_cache_back_refuses_the_cache(monkeypatch):
    from mnngpu.apps.server import prompt_blocks
    from mnngpu.backend import Capabilities

    class NoTransfer:
        caps = Capabilities(kv_transfer=False)

    monkeypatch.setattr(prompt_blocks, "backend_class", lambda name: NoTransfer)
    with pytest.raises(ConfigError, match="kv_transfer") as raised:
        prompt_blocks.PromptBlocks.for_model(load(cache_ram=8))
    assert raised.value.field == "cache_ram"


def test_mnngpu_serve_cache_ram_turns_the_cache_on():
    import httpx

    from tests.serving import ServeProcess

    process = ServeProcess("--quiet", "--cache-ram", "16")
    try:
        for question in QUESTIONS[:2]:
            process.api.chat.completions.create(model=NAME, messages=messages(question), max_tokens=2)
        text = httpx.get(f"http://127.0.0.1:{process.port}/metrics").text
        prompts = [hf_ids(q) for q in QUESTIONS[:2]]
        assert metric(text, "mnngpu_prefix_cache_queries_total") == sum(map(len, prompts))
        assert metric(text, "mnngpu_prefix_cache_hits_total") == sum(expected_hits(prompts)) > 0
    finally:
        process.kill()


def test_a_negative_cache_ram_is_refused_naming_the_flag():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "mnngpu", "serve", "--cache-ram", "-1"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "--cache-ram" in done.stderr and "-1" in done.stderr
