"""Continuous batching (mnngpu.generation.batch) on the CPU: several sequences decoded in one
forward give each prompt the tokens MNN's runtime recorded for it alone, and a reply's end,
cancellation and failure touch only its own sequence."""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from mnngpu.errors import ConfigError, InputError
from mnngpu.generation.batch import Batch, one_sequence_only
from tests.conftest import FIXTURES, MODEL_NAMES, reference

DEMO = FIXTURES.parents[2] / "mnngpu" / "demo" / "model"


class Argmax:
    """A greedy sampler that counts its calls."""

    def __init__(self):
        self.calls = 0

    def sample(self, logits, history) -> int:
        self.calls += 1
        return int(np.argmax(logits))


def load(folder, **overrides):
    model = mnngpu_llm.create(folder)
    model.set_config({"backend_type": "cpu", "precision": "high", "memory": "high", "thread_num": 2, **overrides})
    model.load()
    return model


GREEDY_MODELS = [name for name in MODEL_NAMES if all("greedy" in p for p in reference(name)[0]["prompts"])]


@pytest.mark.parametrize("name", GREEDY_MODELS)
def test_batched_greedy_tokens_are_mnns_for_each_prompt_alone(name):
    ref, _ = reference(name)
    model = load(FIXTURES / name)
    if one_sequence_only(model):
        pytest.skip(f"{name}: {one_sequence_only(model)}")
    batch = Batch(model, slots=4)
    prompts = ref["prompts"] * 2   # more requests than slots: later ones wait for a free slot
    requests = [batch.submit(p["ids"], max_new_tokens=len(p["greedy"]), sampler=Argmax(), stop_ids=())
                for p in prompts]
    batch.run()
    for prompt, request in zip(prompts, requests):
        assert request.finish_reason == "length" and request.error is None
        assert request.tokens == prompt["greedy"], prompt["text"]


@pytest.fixture(scope="module")
def demo():
    return load(DEMO)


def alone(model, ids, limit, stop_ids=None):
    model.reset()
    tokens = model.generate(ids, limit, stop_ids=stop_ids)
    return tokens, model.runtime.kv_meta.previous


def test_replies_end_as_generate_ends_them_and_leave_the_same_cache(demo):
    prompts = [demo.apply_chat_template([{"role": "user", "content": q}])
               for q in ("Tell me about crows.", "What colour is grass?", "Hello!")]
    ids = [demo.tokenizer_encode(p) for p in prompts]
    expected = [alone(demo, i, 24) for i in ids]
    demo.reset()
    batch = Batch(demo, slots=3)
    requests = [batch.submit(i, max_new_tokens=24) for i in ids]
    batch.run()
    for (tokens, held), request in zip(expected, requests):
        assert request.tokens == tokens
        assert request.finish_reason == ("length" if len(tokens) == 24 else "stop")
        # every emitted token but a stop id is in the cache, as after generate()
        assert request.sequence.meta.previous == held
        assert request.sequence.context.output_tokens == tokens


def test_a_slot_is_reused_with_an_empty_cache(demo):
    ids = demo.tokenizer_encode("Once upon a time")
    expected, _ = alone(demo, ids, 12, stop_ids=())
    batch = Batch(demo, slots=1)
    first = batch.submit(ids, max_new_tokens=12, stop_ids=())
    second = batch.submit(ids, max_new_tokens=12, stop_ids=())
    batch.run()
    assert first.tokens == expected and second.tokens == expected
    assert first.sequence is second.sequence


def test_on_token_and_cancel_end_only_their_own_reply(demo):
    ids = demo.tokenizer_encode("Once upon a time")
    expected, _ = alone(demo, ids, 20, stop_ids=())
    batch = Batch(demo, slots=3)
    stopping = batch.submit(ids, max_new_tokens=20, stop_ids=(), on_token=lambda token: True)
    cancelled = batch.submit(ids, max_new_tokens=20, stop_ids=())
    full = batch.submit(ids, max_new_tokens=20, stop_ids=())
    batch.step()
    cancelled.cancel()
    batch.run()
    assert stopping.finish_reason == "cancelled" and stopping.tokens == expected[:1]
    assert cancelled.finish_reason == "cancelled" and cancelled.tokens == expected[: len(cancelled.tokens)]
    assert full.finish_reason == "length" and full.tokens == expected
    assert batch.running == 0 and batch.waiting == 0


def test_a_failed_prompt_fails_alone(demo):
    limit = demo.config.max_all_tokens
    ids = demo.tokenizer_encode("Once upon a time")
    expected, _ = alone(demo, ids, 8, stop_ids=())
    batch = Batch(demo, slots=2)
    too_long = batch.submit([ids[0]] * (limit + 1), max_new_tokens=4)
    fine = batch.submit(ids, max_new_tokens=8, stop_ids=())
    batch.run()
    assert isinstance(too_long.error, InputError) and too_long.error.field == "max_all_tokens"
    with pytest.raises(InputError):
        too_long.wait()
    assert fine.tokens == expected


def test_bad_requests_are_refused_by_name(demo):
    batch = Batch(demo, slots=2)
    with pytest.raises(InputError) as bad_id:
        batch.submit([demo.embedding.vocab_size], max_new_tokens=2)
    assert bad_id.value.field == "input_ids"
    with pytest.raises(InputError) as bad_limit:
        batch.submit([1, 2], max_new_tokens=-1)
    assert bad_limit.value.field == "max_new_tokens"
    with pytest.raises(InputError) as bad_slots:
        Batch(demo, slots=0)
    assert bad_slots.value.field == "parallel"


def test_several_slots_are_refused_where_a_model_decodes_one_sequence_at_a_time():
    model = load(DEMO, speculative_type="lookahead")
    with pytest.raises(ConfigError) as refused:
        Batch(model, slots=2)
    assert refused.value.field == "parallel" and "lookahead" in str(refused.value)
    assert Batch(model, slots=1).slots == 1


def test_a_step_reads_every_weight_once_for_all_decode_rows(demo):
    """The decode rows of a step go through one forward: with three sequences decoding, the
    batched decode module runs once per step (not once per sequence)."""
    ids = demo.tokenizer_encode("Once upon a time")
    batch = Batch(demo, slots=3)
    for _ in range(3):
        batch.submit(ids, max_new_tokens=10, stop_ids=())
    forwards = []
    real = demo.decode_rows
    demo.decode_rows = lambda sequences, tokens: forwards.append(len(tokens)) or real(sequences, tokens)
    try:
        batch.run()
    finally:
        del demo.decode_rows
    assert forwards.count(3) >= 8 and max(forwards) == 3
