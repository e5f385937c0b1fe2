"""Models with recurrent layers (LinearAttention: the qwen3_5 and lfm2 fixtures) served on the
fixed-shape device backends, which cannot batch a recurrent state: one slot decodes with the Llm's
own decode step, so request after request each reply is the one MNN recorded for its prompt alone
(the recurrent state is cleared between them); more slots are refused, naming why.

Truths: MNN's greedy tokens recorded for each fixture (reference.json, each prompt run on a fresh
instance). Without a backend's driver the tests skip with the reason (tests.conftest.backend_or_skip)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mnngpu import llm as mnngpu_llm
from mnngpu.errors import ConfigError
from mnngpu.generation.batch import Batch, default_slots, one_sequence_only
from tests.conftest import FIXTURES, backend_or_skip, reference

MODELS = ("qwen3_5_int4_b64", "lfm2_int4_b64")
DEVICES = ("opencl", "vulkan")
NAME = "recurrent-model"


def load(name: str, backend: str):
    """The fixture as MNN's recording ran it (precision high, 2 threads), decoding greedily."""
    backend_or_skip(backend)
    model = mnngpu_llm.create(FIXTURES / name)
    model.set_config({"backend_type": backend, "precision": "high", "thread_num": 2, "sampler_type": "greedy"})
    model.load()
    return model


def recorded_prompts(name: str) -> list[dict]:
    """Every recorded prompt, then the first again: a reply that read the state an earlier one left differs."""
    prompts = reference(name)[0]["prompts"]
    return [*prompts, prompts[0]]


@pytest.mark.parametrize("backend", DEVICES)
@pytest.mark.parametrize("name", MODELS)
def test_one_slot_replies_as_mnn_request_after_request(name, backend):
    model = load(name, backend)
    assert "recurrent layers" in one_sequence_only(model) and default_slots(model) == 1
    batch = Batch(model, 1)
    batch.warm()
    for prompt in recorded_prompts(name):
        request = batch.submit(prompt["ids"], max_new_tokens=len(prompt["greedy"]), stop_ids=())
        batch.run()
        assert request.wait().tokens == prompt["greedy"], prompt["text"]
        assert request.finish_reason == "length"
        assert request.sequence is batch.sequences[0]


@pytest.mark.parametrize("backend", DEVICES)
@pytest.mark.parametrize("name", MODELS)
def test_a_server_with_the_default_slots_replies_as_mnn(name, backend):
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    pytest.importorskip("openai")
    from mnngpu.apps.server.app import create_app
    from mnngpu.apps.server.engine import ServedModel
    from tests.serving import openai_client, running

    model = load(name, backend)
    served = ServedModel(model, NAME, parallel=default_slots(model))
    try:
        with running(create_app(served)) as client:
            api = openai_client(client)
            for prompt in recorded_prompts(name)[:2] + recorded_prompts(name)[:1]:
                greedy = prompt["greedy"]
                assert not any(model.tokenizer.is_stop(token) for token in greedy)
                reply = api.completions.create(model=NAME, prompt=prompt["ids"], max_tokens=len(greedy),
                                               temperature=0)
                assert reply.choices[0].text == "".join(model.tokenizer.decode(t) for t in greedy), prompt["text"]
                assert reply.choices[0].finish_reason == "length"
                assert reply.usage.completion_tokens == len(greedy)
    finally:
        served.close()
    assert served.parallel == 1


@pytest.mark.parametrize("backend", DEVICES)
def test_two_slots_are_refused_naming_the_recurrent_layers(backend):
    model = load(MODELS[0], backend)
    with pytest.raises(ConfigError) as refused:
        Batch(model, 2)
    assert refused.value.field == "parallel"
    assert "recurrent layers (LinearAttention)" in str(refused.value) and backend in str(refused.value)


def test_serve_with_parallel_2_on_vulkan_exits_with_the_reason():
    backend_or_skip("vulkan")
    done = subprocess.run([sys.executable, "-m", "mnngpu", "serve", str(FIXTURES / MODELS[0]), "--backend", "vulkan",
                           "--parallel", "2", "--port", "0"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "error: parallel: 2 slots: batching models with recurrent layers (LinearAttention) is not implemented " \
           "on the vulkan backend" in done.stderr
    assert "serving " not in done.stderr
