"""Log-probabilities over HTTP with the `openai` client: chat logprobs, the completions endpoint's
legacy logprobs, and echo (lm-evaluation-harness's loglikelihood request).

Truths: a numpy log-softmax, written here, of the logits mnngpu's own forward gives for the same
ids with all_logits (a second model instance); MNN's recorded greedy replies; the HF tokenizer
for the prompts' ids.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from mnngpu.apps.server.app import create_app
from mnngpu.apps.server.engine import ServedModel
from tests.reference_model import (
    CHAT_PROMPT,
    CHAT_QUESTION,
    RAW_PROMPT,
    greedy_reply,
    hf_tokenizer,
    load_model,
)
from tests.serving import openai_client, running

TOLERANCE = 1e-4
MODEL = "fixture-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": CHAT_QUESTION}], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def api():
    with running(create_app(ServedModel(load_model(), MODEL))) as client:
        yield openai_client(client)


@pytest.fixture(scope="module")
def truth_model():
    return load_model(all_logits=True)


def numpy_log_softmax(rows: np.ndarray) -> np.ndarray:
    x = np.asarray(rows, dtype=np.float64)
    top = x.max(axis=-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))


def truth_logprobs(model, ids: list[int]) -> np.ndarray:
    """Row i: log-probabilities of the token after ids[: i + 1], from the model's own logits."""
    model.reset()
    return numpy_log_softmax(np.asarray(model.forward(ids))[0])


def ids_of(text: str) -> list[int]:
    return hf_tokenizer().encode(text).ids


def test_chat_logprobs_are_the_log_softmax_of_the_models_logits(api, truth_model):
    reply = api.chat.completions.create(**CHAT, logprobs=True, top_logprobs=5)
    prompt, generated = ids_of(CHAT_PROMPT), greedy_reply(CHAT_PROMPT, 8)[0]
    rows = truth_logprobs(truth_model, prompt + generated)
    content = reply.choices[0].logprobs.content
    assert len(content) == len(generated)
    for position, (entry, token) in enumerate(zip(content, generated)):
        expected = rows[len(prompt) - 1 + position]
        assert entry.logprob == pytest.approx(expected[token], abs=TOLERANCE)
        best = np.sort(expected)[::-1][:5]
        np.testing.assert_allclose([t.logprob for t in entry.top_logprobs], best, atol=TOLERANCE)
    assert b"".join(bytes(e.bytes) for e in content).decode(errors="replace") == reply.choices[0].message.content


def test_chat_logprobs_without_top_logprobs_list_no_alternatives(api):
    content = api.chat.completions.create(**CHAT, logprobs=True).choices[0].logprobs.content
    assert content and all(entry.top_logprobs == [] for entry in content)
    assert api.chat.completions.create(**CHAT).choices[0].logprobs is None


def test_streamed_chat_logprobs_add_up_to_the_whole_replys(api):
    whole = api.chat.completions.create(**CHAT, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    streamed = []
    for chunk in api.chat.completions.create(**CHAT, logprobs=True, top_logprobs=2, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole]
    assert [e.top_logprobs for e in streamed] == [e.top_logprobs for e in whole]


@pytest.mark.parametrize("as_ids", [True, False])
def test_echo_with_logprobs_scores_every_prompt_token_as_a_loglikelihood_would(api, truth_model, as_ids):
    text = CHAT_QUESTION
    prompt = ids_of(text)
    reply = api.completions.create(model=MODEL, prompt=prompt if as_ids else text, echo=True, logprobs=1,
                                   max_tokens=1, temperature=0)
    logprobs = reply.choices[0].logprobs
    rows = truth_logprobs(truth_model, prompt)
    expected = [rows[i - 1][prompt[i]] for i in range(1, len(prompt))]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert len(logprobs.token_logprobs) == len(prompt) + 1
    np.testing.assert_allclose(logprobs.token_logprobs[1:len(prompt)], expected, atol=TOLERANCE)
    # lm-evaluation-harness: a continuation's loglikelihood is the sum over its tokens, [ctxlen:-1]
    context = 3
    assert sum(logprobs.token_logprobs[context:-1]) == pytest.approx(sum(expected[context - 1:]), abs=TOLERANCE)
    assert logprobs.token_logprobs[-1] == pytest.approx(rows[-1].max(), abs=TOLERANCE)   # greedy: the best
    assert reply.choices[0].text == text + greedy_reply_after(prompt, truth_model)


def greedy_reply_after(ids: list[int], model) -> str:
    model.reset()
    token = int(np.argmax(np.asarray(model.forward(ids))[0, -1]))
    return hf_tokenizer().decode([token])


def test_echo_text_offsets_point_at_each_tokens_text(api):
    reply = api.completions.create(model=MODEL, prompt=CHAT_QUESTION, echo=True, logprobs=0, max_tokens=0)
    choice = reply.choices[0]
    offsets = choice.logprobs.text_offset + [len(choice.text)]
    assert choice.text == CHAT_QUESTION and choice.finish_reason == "length"
    assert [choice.text[a:b] for a, b in itertools.pairwise(offsets)] == choice.logprobs.tokens
    assert reply.usage.completion_tokens == 0 and reply.usage.prompt_tokens == len(ids_of(CHAT_QUESTION))


def test_completion_logprobs_of_a_sampled_reply_add_up_over_the_stream(api):
    request = {"model": MODEL, "prompt": RAW_PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": 3, "logprobs": 3}
    whole = api.completions.create(**request).choices[0]
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    text = ""
    for chunk in api.completions.create(**request, stream=True):
        text += chunk.choices[0].text
        if chunk.choices[0].logprobs is not None:
            for key in streamed:
                streamed[key] += getattr(chunk.choices[0].logprobs, key)
    assert text == whole.text and len(whole.logprobs.tokens) == 6
    assert streamed == {key: getattr(whole.logprobs, key) for key in streamed}
    assert all(len(top) >= 3 for top in whole.logprobs.top_logprobs)


def test_a_sampled_replys_logprobs_are_the_models_before_temperature_and_penalties(api, truth_model):
    reply = api.chat.completions.create(**{**CHAT, "temperature": 1.7, "top_p": 0.5, "seed": 11,
                                           "presence_penalty": 1.0}, logprobs=True)
    by_bytes = {}
    for token in range(truth_model.tokenizer.vocab_size):
        by_bytes.setdefault(truth_model.tokenizer.token_bytes(token), token)
    sampled = [by_bytes[bytes(entry.bytes)] for entry in reply.choices[0].logprobs.content]
    prompt = ids_of(CHAT_PROMPT)
    rows = truth_logprobs(truth_model, prompt + sampled)
    expected = [rows[len(prompt) - 1 + i][token] for i, token in enumerate(sampled)]
    np.testing.assert_allclose([e.logprob for e in reply.choices[0].logprobs.content], expected, atol=TOLERANCE)


def test_logprobs_outside_their_range_are_refused(api):
    for request in ({"logprobs": True, "top_logprobs": 21}, {"top_logprobs": 2}):
        with pytest.raises(openai.BadRequestError) as refused:
            api.chat.completions.create(**CHAT, **request)
        assert refused.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as refused:
        api.completions.create(model=MODEL, prompt=RAW_PROMPT, logprobs=21)
    assert refused.value.body["param"] == "logprobs"


def test_a_stop_string_cuts_the_logprobs_where_it_cuts_the_text(api):
    full = api.completions.create(model=MODEL, prompt=RAW_PROMPT, max_tokens=16, temperature=0, logprobs=0).choices[0]
    offsets = full.logprobs.text_offset
    # a stop string that starts inside the text of the fourth token that has any text
    starts = [o for i, o in enumerate(offsets) if i + 1 == len(offsets) or offsets[i + 1] > o]
    cut = starts[3]
    stop = full.text[cut:cut + 2]
    request = {"model": MODEL, "prompt": RAW_PROMPT, "max_tokens": 16, "temperature": 0, "logprobs": 0, "stop": [stop]}
    cut_reply = api.completions.create(**request).choices[0]
    assert cut_reply.text == full.text[:full.text.index(stop)] and cut_reply.finish_reason == "stop"
    kept = [i for i, offset in enumerate(offsets) if offset < len(cut_reply.text)]
    assert cut_reply.logprobs.tokens == [full.logprobs.tokens[i] for i in kept]
    assert cut_reply.logprobs.token_logprobs == [full.logprobs.token_logprobs[i] for i in kept]
    streamed = []
    for chunk in api.completions.create(**request, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.token_logprobs
    assert streamed == cut_reply.logprobs.token_logprobs


def test_mnngpu_serve_answers_health_tokenize_and_a_loglikelihood_request(truth_model):
    import httpx

    from tests.serving import ServeProcess

    server = ServeProcess("--quiet")
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert httpx.get(f"{base}/health").json() == {"status": "ok"}
        prompt = httpx.post(f"{base}/tokenize", json={"prompt": CHAT_QUESTION}).json()["tokens"]
        reply = server.api.completions.create(model="any", prompt=[prompt], echo=True, logprobs=1, max_tokens=1,
                                              temperature=0)
    finally:
        server.kill()
    rows = truth_logprobs(truth_model, prompt)
    expected = sum(rows[i - 1][prompt[i]] for i in range(1, len(prompt)))
    assert prompt == ids_of(CHAT_QUESTION)
    assert sum(reply.choices[0].logprobs.token_logprobs[1:-1]) == pytest.approx(expected, abs=TOLERANCE)
