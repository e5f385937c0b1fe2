"""GET /metrics: scraped with prometheus_client's own parser, the counters move by exactly what
the requests' usage says was read and generated, the histograms get one time per request and
per later token, and the gauges show the queue, the running request and the KV cache.

Truths: each reply's `usage` (checked against the HF tokenizer and MNN's replies in
test_server.py); for the KV cache, the HF config's layer and head counts.
"""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
prometheus_client = pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")

from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from mnngpu.apps.server.app import create_app
from mnngpu.apps.server.engine import ServedModel
from mnngpu.apps.server.models import ModelSlot
from mnngpu.apps.server.protocol import parse_completion_request
from tests.conftest import FIXTURES
from tests.reference_model import CHAT_QUESTION, MODEL, RAW_PROMPT, load_model
from tests.serving import WAIT_S, openai_client, running

NAME = "fixture-model"
MESSAGES = [{"role": "user", "content": CHAT_QUESTION}]


@pytest.fixture(scope="module")
def served():
    return ServedModel(load_model(), NAME)


@pytest.fixture(scope="module")
def server(served):
    with running(create_app(served)) as client:
        yield client, openai_client(client)


def scrape(client) -> dict[tuple[str, tuple], float]:
    """Every sample of GET /metrics: (name, sorted labels) -> value."""
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text) for sample in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(before: dict, after: dict, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def requests(endpoint: str, status: int) -> dict:
    return {"endpoint": endpoint, "status": str(status)}


def streamed_usage(chunks) -> tuple[object, list[str]]:
    usage, finishes = None, []
    for chunk in chunks:
        usage = chunk.usage or usage
        finishes += [choice.finish_reason for choice in chunk.choices if choice.finish_reason]
    return usage, finishes


def test_the_counters_move_by_exactly_the_usage_of_the_requests_made(server):
    client, api = server
    before = scrape(client)
    chat = api.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=6, temperature=0)
    many = api.completions.create(model=NAME, prompt=[RAW_PROMPT, "Hello"], n=2, max_tokens=5, temperature=0)
    stream_usage, stream_finishes = streamed_usage(api.completions.create(
        model=NAME, prompt=RAW_PROMPT, max_tokens=7, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    with pytest.raises(openai.BadRequestError):
        api.chat.completions.create(model=NAME, messages=[{"role": "robot", "content": "x"}])
    assert client.get("/no/such/path").status_code == 404
    after = scrape(client)

    usages = [chat.usage, many.usage, stream_usage]
    finishes = [c.finish_reason for c in chat.choices + many.choices] + stream_finishes
    assert finishes == ["length"] * 6   # each choice sampled exactly max_tokens tokens
    assert moved(before, after, "mnngpu_prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert moved(before, after, "mnngpu_generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert moved(before, after, "mnngpu_prompt_cached_tokens_total") == sum(
        u.prompt_tokens_details.cached_tokens for u in usages)
    assert moved(before, after, "mnngpu_requests_total", **requests("/v1/chat/completions", 200)) == 1
    assert moved(before, after, "mnngpu_requests_total", **requests("/v1/chat/completions", 400)) == 1
    assert moved(before, after, "mnngpu_requests_total", **requests("/v1/completions", 200)) == 2
    assert moved(before, after, "mnngpu_requests_total", **requests("other", 404)) == 1
    assert moved(before, after, "mnngpu_requests_total", **requests("/metrics", 200)) == 1   # the first scrape

    # one time to first token per request that generated; one time per token after each choice's first
    assert moved(before, after, "mnngpu_time_to_first_token_seconds_count") == 3
    choices = len(chat.choices) + len(many.choices) + 1
    assert moved(before, after, "mnngpu_time_per_output_token_seconds_count") == (
        sum(u.completion_tokens for u in usages) - choices)
    assert moved(before, after, "mnngpu_time_per_output_token_seconds_sum") > 0
    assert value(after, "mnngpu_time_to_first_token_seconds_bucket", le="+Inf") == value(
        after, "mnngpu_time_to_first_token_seconds_count")


def kv_bytes_per_token() -> int:
    """Keys and values of every layer, float32 on the CPU backend, from the HF config."""
    config = json.loads((FIXTURES / MODEL / "hf" / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 4


def test_the_kv_cache_gauges_show_the_tokens_the_last_reply_left_in_it(server):
    client, api = server
    reply = api.completions.create(model=NAME, prompt=RAW_PROMPT, max_tokens=9, temperature=0)
    assert reply.choices[0].finish_reason == "length"
    samples = scrape(client)
    held = reply.usage.prompt_tokens + reply.usage.completion_tokens   # every emitted token enters the cache
    limit = client.post("/tokenize", json={"prompt": "x"}).json()["max_model_len"]
    capacity = value(samples, "mnngpu_kv_cache_capacity_tokens")
    assert value(samples, "mnngpu_kv_cache_tokens") == held
    assert held <= capacity and value(samples, "mnngpu_kv_cache_max_tokens") == limit
    assert value(samples, "mnngpu_kv_cache_usage_ratio") == pytest.approx(held / limit)
    assert value(samples, "mnngpu_kv_cache_bytes") == capacity * kv_bytes_per_token()
    assert value(samples, "mnngpu_requests_running") == 0 and value(samples, "mnngpu_requests_waiting") == 0


def test_the_queue_and_running_gauges_while_a_request_is_held(server, served):
    client = server[0]
    started, release = threading.Event(), threading.Event()

    def hold(piece) -> None:
        started.set()
        release.wait(WAIT_S)

    body = {"prompt": RAW_PROMPT, "max_tokens": 2, "temperature": 0}
    held = served.new_job(RAW_PROMPT, parse_completion_request(body))
    held.on_text = hold
    first = served.submit(held)
    try:
        assert started.wait(WAIT_S)
        second = served.submit(served.new_job(RAW_PROMPT, parse_completion_request(body)))
        samples = scrape(client)
        assert value(samples, "mnngpu_requests_running") == 1 and value(samples, "mnngpu_requests_waiting") == 1
    finally:
        release.set()
    first.result(WAIT_S), second.result(WAIT_S)
    samples = scrape(client)
    assert value(samples, "mnngpu_requests_running") == 0 and value(samples, "mnngpu_requests_waiting") == 0


def test_metrics_answer_while_the_model_loads_with_the_http_counts_alone():
    slot = ModelSlot()
    client = TestClient(create_app(slot))
    assert client.get("/health").status_code == 503
    names = {name for name, _ in scrape(client)}
    assert "mnngpu_requests_total" in names and not any(name.startswith("mnngpu_kv_cache") for name in names)
    assert value(scrape(client), "mnngpu_requests_total", **requests("/health", 503)) == 1
