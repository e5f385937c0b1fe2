"""The OpenAI-compatible server, over loopback with a real HTTP client (uvicorn in a thread).

Truths: MNN's recorded greedy replies for the fixture's prompts, and the HF tokenizer and
chat template of its source for the usage counts.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from pathlib import Path

import pytest

pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from mnngpu.server.app import create_app
from mnngpu.server.engine import ServedModel
from tests.reference_model import (
    CHAT_PROMPT,
    CHAT_QUESTION,
    RAW_PROMPT,
    greedy_reply,
    hf_count,
    hf_render,
    load_model,
)

MAX_BODY = 4096
WAIT_S = 120  # generous bounds on waits that should end at once; no assertion is timed
CHAT = {"messages": [{"role": "user", "content": CHAT_QUESTION}], "max_tokens": 8, "temperature": 0}
COMPLETION = {"prompt": RAW_PROMPT, "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    served = ServedModel(load_model(), "fixture-model")
    config = uvicorn.Config(create_app(served, max_body_bytes=MAX_BODY), host="127.0.0.1", port=0,
                            log_level="warning", lifespan="on")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    while not running.started:
        if not thread.is_alive():
            pytest.fail("the server did not start")
        thread.join(0.05)
    port = running.servers[0].sockets[0].getsockname()[1]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=WAIT_S) as client:
        yield client, served
    running.should_exit = True
    thread.join(WAIT_S)


def expected_chat(max_tokens: int = 8) -> tuple[list[int], str]:
    return greedy_reply(CHAT_PROMPT, max_tokens)


def sse_payloads(lines) -> list:
    payloads = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def assert_openai_error(response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def test_models_lists_the_served_model(server):
    client, _ = server
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["fixture-model"]


def test_chat_completion_gives_mnns_greedy_reply_and_true_usage(server):
    client, _ = server
    body = client.post("/v1/chat/completions", json=CHAT).json()
    ids, text = expected_chat()
    choice = body["choices"][0]
    assert body["object"] == "chat.completion"
    assert choice["message"] == {"role": "assistant", "content": text}
    assert choice["finish_reason"] == ("length" if len(ids) == 8 else "stop")
    prompt_tokens = hf_count(hf_render(CHAT["messages"]))
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    assert body["usage"]["completion_tokens"] == len(ids)
    assert body["usage"]["total_tokens"] == prompt_tokens + len(ids)


def test_completion_uses_the_prompt_without_a_template(server):
    client, _ = server
    body = client.post("/v1/completions", json=COMPLETION).json()
    ids, text = greedy_reply(RAW_PROMPT, 8)
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == text
    assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (hf_count(RAW_PROMPT), len(ids))


def test_streamed_chat_sends_the_same_reply_as_events(server):
    client, _ = server
    request = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=request) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(response.iter_lines())
    assert payloads[-1] == "[DONE]"
    chunks, usage = payloads[:-2], payloads[-2]["usage"]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    ids, expected = expected_chat()
    assert text == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == ("length" if len(ids) == 8 else "stop")
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert usage["completion_tokens"] == len(ids)
    assert usage["prompt_tokens"] == hf_count(hf_render(CHAT["messages"]))


def test_two_concurrent_clients_each_get_their_own_reply(server):
    client, _ = server
    start = threading.Barrier(2)
    results: dict[str, str] = {}

    def ask_chat():
        start.wait(WAIT_S)
        results["chat"] = client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]

    def ask_streamed_completion():
        start.wait(WAIT_S)
        with client.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True}) as response:
            results["completion"] = "".join(p["choices"][0]["text"] for p in sse_payloads(response.iter_lines())
                                            if p != "[DONE]")

    threads = [threading.Thread(target=ask_chat), threading.Thread(target=ask_streamed_completion)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert results == {"chat": expected_chat()[1], "completion": greedy_reply(RAW_PROMPT, 8)[1]}


def test_a_client_that_disconnects_mid_stream_stops_its_generation(server):
    client, served = server
    long_request = {**COMPLETION, "max_tokens": 2000, "stream": True}
    with served.stats.done:
        finished_before, cancelled_before = served.stats.finished, served.stats.cancelled
    with client.stream("POST", "/v1/completions", json=long_request) as response:
        lines = response.iter_lines()
        while not any(p != "[DONE]" and p["choices"][0]["text"] for p in sse_payloads([next(lines)])):
            pass  # read until the first piece of text, then hang up
    with served.stats.done:
        assert served.stats.done.wait_for(lambda: served.stats.finished > finished_before, WAIT_S)
        assert served.stats.cancelled == cancelled_before + 1
    assert served.llm.context.gen_seq_len < long_request["max_tokens"]
    body = client.post("/v1/chat/completions", json=CHAT).json()  # the next request starts clean
    assert body["choices"][0]["message"]["content"] == expected_chat()[1]
    assert body["usage"]["prompt_tokens"] == hf_count(CHAT_PROMPT)


def test_an_oversize_body_gets_413(server):
    client, _ = server
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    assert_openai_error(client.post("/v1/chat/completions", json=big), 413)
    chunks = iter([b'{"prompt": "', b"y" * MAX_BODY, b'"}'])  # no Content-Length: sent chunked
    assert_openai_error(client.post("/v1/completions", content=chunks), 413)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", b"{not json", None),
    ("/v1/chat/completions", b"[1, 2]", None),
    ("/v1/chat/completions", b'{"messages": "hi"}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"content": "no role"}]}', "messages[0]"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "temperature": "warm"}', "temperature"),
    ("/v1/completions", b'{"prompt": "x", "stop": [1]}', "stop"),
    ("/v1/completions", b'{"prompt": "x", "n": 2}', "n"),
    ("/v1/completions", b'{"max_tokens": 3}', "prompt"),
])
def test_a_malformed_body_gets_400_with_an_openai_error(server, path, body, param):
    client, _ = server
    error = assert_openai_error(client.post(path, content=body, headers={"content-type": "application/json"}),
                                400, param)
    assert error["type"] == "invalid_request_error"


def test_unknown_routes_and_methods_get_openai_errors(server):
    client, _ = server
    assert_openai_error(client.get("/v1/nothing"), 404)
    assert_openai_error(client.get("/v1/completions"), 405)


def test_a_stop_string_ends_the_reply_before_it(server):
    client, _ = server
    _, full = greedy_reply(RAW_PROMPT, 16)
    stop = next(full[i:i + 2] for i in range(1, len(full) - 1) if full[i:i + 2].isascii() and full[i:i + 2].isalpha())
    body = client.post("/v1/completions", json={**COMPLETION, "max_tokens": 16, "stop": [stop]}).json()
    assert body["choices"][0] == {"index": 0, "text": full[:full.index(stop)], "logprobs": None,
                                  "finish_reason": "stop"}


def test_sampling_settings_stay_with_their_request(server):
    client, _ = server
    sampled = {**COMPLETION, "temperature": 1.0, "top_p": 0.9, "seed": 7}
    first = client.post("/v1/completions", json=sampled).json()["choices"][0]["text"]
    assert client.post("/v1/completions", json=sampled).json()["choices"][0]["text"] == first
    greedy = client.post("/v1/completions", json=COMPLETION).json()["choices"][0]["text"]
    assert greedy == greedy_reply(RAW_PROMPT, 8)[1]


def test_with_reuse_kv_a_continued_chat_prefills_only_its_new_turn(server):
    client, served = server
    served.llm.set_config({"reuse_kv": True})
    try:
        first = client.post("/v1/chat/completions", json=CHAT).json()
        reply = first["choices"][0]["message"]["content"]
        messages = [*CHAT["messages"], {"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
        second = client.post("/v1/chat/completions", json={**CHAT, "messages": messages}).json()
    finally:
        served.llm.set_config({"reuse_kv": False})
    cached = first["usage"]["total_tokens"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
    new_text = hf_render(messages)[len(CHAT_PROMPT + reply):]
    assert second["usage"]["prompt_tokens"] == cached + hf_count(new_text)
    assert served.llm.context.prompt_len == hf_count(new_text)


def test_a_client_that_hangs_up_before_a_plain_reply_stops_its_generation(server):
    client, served = server
    body = json.dumps({**COMPLETION, "max_tokens": 2000}).encode()
    with served.stats.done:
        finished_before, cancelled_before = served.stats.finished, served.stats.cancelled
    host, port = client.base_url.host, client.base_url.port
    with socket.create_connection((host, port), timeout=WAIT_S) as raw:
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    with served.stats.done:
        assert served.stats.done.wait_for(lambda: served.stats.finished > finished_before, WAIT_S)
        assert served.stats.cancelled == cancelled_before + 1
    assert client.post("/v1/completions", json=COMPLETION).json()["choices"][0]["text"] == greedy_reply(RAW_PROMPT, 8)[1]


def test_a_prompt_longer_than_the_context_gets_400(server):
    client, served = server
    original = served.llm.config.max_all_tokens
    served.llm.set_config({"max_all_tokens": 16})
    try:
        response = client.post("/v1/chat/completions", json=CHAT)
    finally:
        served.llm.set_config({"max_all_tokens": original})
    assert assert_openai_error(response, 400)["code"] == "context_length_exceeded"


def test_the_curl_examples_in_the_docs_work(server):
    client, _ = server
    root = Path(__file__).resolve().parents[1]
    examples = []
    for doc in ("README.md", "docs/server.md"):
        text = (root / doc).read_text()
        examples += re.findall(r"curl -sN? http://127\.0\.0\.1:8000(/v1/\S+).*?-d '([^']+)'", text, re.DOTALL)
    assert len(examples) >= 3
    for path, body in examples:
        response = client.post(path, content=body.encode(), headers={"content-type": "application/json"})
        assert response.status_code == 200, (path, response.text)
