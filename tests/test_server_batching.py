"""The server's slots: concurrent clients are generated together and each gets the reply it gets
alone; n > 1 runs as n sequences; streams cut off mid-reply leave no slot, sequence or thread
behind.

Truths: MNN's greedy replies recorded for the fixture (tests/reference_model.py), through a
server with one slot, which test_server.py checks against MNN; thread and slot counts."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from mnngpu.apps.server.app import create_app
from mnngpu.apps.server.engine import ServedModel
from mnngpu.apps.server.protocol import parse_chat_request
from tests.reference_model import CHAT_QUESTION, load_model
from tests.serving import WAIT_S, openai_client, running

NAME = "fixture-model"
QUESTIONS = [CHAT_QUESTION, "Who is the farmer?", "What is in the barn?", "hello", "Tell me a story.",
             "Who feeds the cows?"]
SLOTS = 4


def chat(api, question: str, **fields):
    fields = {"max_tokens": 24, "temperature": 0, **fields}
    return api.chat.completions.create(model=NAME, messages=[{"role": "user", "content": question}], **fields)


@pytest.fixture(scope="module")
def served():
    model = ServedModel(load_model(), NAME, parallel=SLOTS)
    yield model
    model.close()


@pytest.fixture(scope="module")
def api(served):
    with running(create_app(served)) as client:
        yield openai_client(client)


@pytest.fixture(scope="module")
def alone():
    """Each question's reply from a server with one slot, one request at a time."""
    single = ServedModel(load_model(), NAME)
    try:
        with running(create_app(single)) as client:
            api = openai_client(client)
            yield {q: chat(api, q).choices[0].message.content for q in QUESTIONS}
    finally:
        single.close()


def test_concurrent_clients_get_the_replies_they_get_alone(api, alone, served):
    with ThreadPoolExecutor(len(QUESTIONS)) as clients:
        replies = list(clients.map(lambda q: chat(api, q), QUESTIONS * 2))
    for question, reply in zip(QUESTIONS * 2, replies):
        assert reply.choices[0].message.content == alone[question], question
    assert served.batch.running == 0 and len(served.slots.free) == SLOTS


def test_concurrent_streams_get_the_replies_they_get_alone(api, alone):
    def streamed(question: str) -> str:
        stream = chat(api, question, stream=True)
        return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    with ThreadPoolExecutor(SLOTS) as clients:
        texts = list(clients.map(streamed, QUESTIONS))
    assert texts == [alone[q] for q in QUESTIONS]


def test_n_choices_run_as_sequences_of_their_own(api, alone, served):
    reply = chat(api, CHAT_QUESTION, n=3)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.message.content == alone[CHAT_QUESTION] for c in reply.choices)
    seeded = [chat(api, CHAT_QUESTION, n=3, temperature=1.0, seed=7) for _ in range(2)]
    texts = [[c.message.content for c in r.choices] for r in seeded]
    assert texts[0] == texts[1]   # seeded choices repeat ...
    assert len(set(texts[0])) > 1   # ... and differ from each other


def test_a_hundred_streams_cut_off_mid_reply_leave_nothing_behind(served):
    before = threading.active_count()
    started = []

    def cut_after_first_piece(job):
        def on_text(piece) -> None:
            if piece.text:
                started.append(piece.index)
                job.cancel()
        return on_text

    futures = []
    for _ in range(100):
        body = {"messages": [{"role": "user", "content": CHAT_QUESTION}], "max_tokens": 64, "temperature": 0,
                "stream": True}
        job = served.new_job(served.chat_prompt(body["messages"]), parse_chat_request(body))
        job.on_text = cut_after_first_piece(job)
        while served.waiting >= served.max_queue:   # the queue is bounded: submit as it drains
            threading.Event().wait(0.01)
        futures.append(served.submit(job))
    results = [future.result(WAIT_S) for future in futures]
    assert all(r.choices[0].finish_reason == "cancelled" for r in results) and len(started) >= 1
    assert served.running == 0 and served.waiting == 0
    assert len(served.slots.free) == SLOTS and served.batch.running == 0 and served.batch.waiting == 0
    assert len(served.batch.sequences) == SLOTS   # no sequence (KV cache) beyond the slots'
    assert threading.active_count() <= before


def test_a_grammar_that_fails_mid_reply_fails_its_request_alone(api, alone):
    """llguidance's lexer gives up on this regex after the first token: the request gets a 400 naming
    the field, and the slots go on serving."""
    with pytest.raises(openai.BadRequestError) as failed:
        chat(api, CHAT_QUESTION, response_format={"type": "regex", "regex": "a{1000000}"})
    assert "response_format" in str(failed.value)
    assert chat(api, CHAT_QUESTION).choices[0].message.content == alone[CHAT_QUESTION]
