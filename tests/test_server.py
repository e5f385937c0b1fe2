"""The OpenAI-compatible server, over loopback with a real HTTP client (uvicorn in a thread).

Truths: MNN's recorded greedy replies for the fixture's prompts, and the HF tokenizer and
chat template of its source for the usage counts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from starlette.testclient import TestClient

from mnngpu.apps.server.app import create_app
from mnngpu.apps.server.engine import ServedModel
from tests.reference_model import (
    CHAT_PROMPT,
    CHAT_QUESTION,
    RAW_PROMPT,
    greedy_reply,
    hf_count,
    hf_render,
    load_model,
)
from tests.serving import WAIT_S, ServeProcess, openai_client, running

MAX_BODY = 4096
CHAT = {"messages": [{"role": "user", "content": CHAT_QUESTION}], "max_tokens": 8, "temperature": 0}
COMPLETION = {"prompt": RAW_PROMPT, "max_tokens": 8, "temperature": 0}
JSON = {"content-type": "application/json"}
MAX_DEPTH = 100   # docs/server.md: the deepest a body may nest arrays and objects, the body being level 1
# every route, as docs/server.md's table of endpoints lists them
ROUTES = ["GET /", "POST /v1/chat/completions", "POST /v1/completions", "POST /v1/messages",
          "POST /v1/messages/count_tokens", "POST /v1/responses", "GET /v1/responses/{response_id}", "GET /v1/models",
          "GET /v1/models/{model_id}", "GET /health", "POST /tokenize", "POST /detokenize", "GET /tokenizer_info",
          "GET /metrics", "POST /v1/embeddings", "POST /v1/rerank", "POST /rerank"]


@pytest.fixture(scope="module")
def server():
    served = ServedModel(load_model(), "fixture-model")
    with running(create_app(served, max_body_bytes=MAX_BODY)) as client:
        yield client, served


@pytest.fixture(scope="module")
def in_process(server):
    """The same model, in process, with the default body limit (1 MiB: a body nested 1,000 objects deep
    is 6 KB) and raising any exception that gets past the app's error handlers, the exceptions uvicorn
    logs with a traceback. Never entered, so its lifespan does not close the model the server shares."""
    _, served = server
    return TestClient(create_app(served), raise_server_exceptions=True)


@contextlib.contextmanager
def server_log() -> Iterator[list[logging.LogRecord]]:
    """The records the app's error logger writes in the block (whatever a test before set its level or
    handlers to)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("mnngpu.server")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def nested(levels: int, opener: str = "[", closer: str = "]") -> str:
    """JSON text of a value `levels` arrays (or objects) deep; json.dumps would overflow the stack."""
    return opener * levels + "1" + closer * levels


def with_field(body: dict, name: str, value_json: str) -> bytes:
    return (json.dumps(body)[:-1] + f', "{name}": {value_json}}}').encode()


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
    ("/v1/completions", b'{"prompt": "x", "n": 0}', "n"),
    ("/v1/completions", b'{"max_tokens": 3}', "prompt"),
])
def test_a_malformed_body_gets_400_with_an_openai_error(server, path, body, param):
    client, _ = server
    error = assert_openai_error(client.post(path, content=body, headers={"content-type": "application/json"}),
                                400, param)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(("path", "field"), [("/v1/chat/completions", "messages"), ("/v1/completions", "prompt"),
                                           ("/tokenize", "prompt"), ("/detokenize", "tokens")])
@pytest.mark.parametrize(("opener", "closer"), [("[", "]"), ('{"a": ', "}")], ids=["arrays", "objects"])
def test_a_body_nested_1000_levels_deep_gets_400_and_no_traceback(in_process, path, field, opener, closer):
    body = f'{{"{field}": {nested(1000, opener, closer)}}}'.encode()   # 2 KB of `[`, or 6 KB of objects
    with server_log() as records:
        response = in_process.post(path, content=body, headers=JSON)
    error = assert_openai_error(response, 400)
    assert error == {"message": f"the body nests arrays and objects more than {MAX_DEPTH} levels deep",
                     "type": "invalid_request_error", "param": None, "code": "nested_too_deep"}
    assert [(r.levelno, r.exc_info) for r in records] == [(logging.WARNING, None)]   # one line, no traceback


def test_a_body_may_nest_100_levels_and_no_more(server):
    client, _ = server
    reply = {**CHAT, "max_tokens": 1}   # metadata is inert: only its depth can refuse the body
    ok = client.post("/v1/chat/completions", content=with_field(reply, "metadata", nested(MAX_DEPTH - 1)),
                     headers=JSON)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length", ok.text
    deep = client.post("/v1/chat/completions", content=with_field(reply, "metadata", nested(MAX_DEPTH)),
                       headers=JSON)
    assert assert_openai_error(deep, 400)["code"] == "nested_too_deep"


def test_a_json_schema_nested_48_objects_deep_fits_under_the_depth_limit(in_process):
    pytest.importorskip("llguidance")
    schema = {"type": "string"}
    for _ in range(48):   # levels 4 to 100 of the body: each object is a schema and its `properties`
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"], "additionalProperties": False}
    response_format = {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}}
    response = in_process.post("/v1/chat/completions", json={**CHAT, "response_format": response_format})
    assert response.status_code == 200, response.text
    content = re.sub(r"\s", "", response.json()["choices"][0]["message"]["content"])
    assert content and ('{"a":' * 48).startswith(content)   # the reply follows the schema as far as it got


def test_an_unknown_path_gets_a_404_naming_it_and_the_routes(server):
    client, _ = server
    for method, path in [("GET", "/v1/nothing"), ("POST", "/v1/audio/speech")]:
        error = assert_openai_error(client.request(method, path), 404)
        assert error["type"] == "not_found_error" and error["code"] == "unknown_route"
        assert error["message"].startswith(f"no route {method} {path}; this server has "), error
        assert error["message"].endswith(", ".join(ROUTES)), error


def test_a_known_path_with_another_method_gets_a_405_with_allow(server):
    client, _ = server
    response = client.get("/v1/completions")
    assert assert_openai_error(response, 405)["type"] == "invalid_request_error"
    assert response.headers["allow"] == "POST"


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


# ---- the OpenAI client, and `mnngpu serve` as a user starts it -----------------------------------------------

openai = pytest.importorskip("openai")


def test_models_retrieve_finds_the_served_model_and_no_other(server):
    api = openai_client(server[0])
    assert api.models.retrieve("fixture-model").id == "fixture-model"
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("another-model")


def test_an_unknown_message_role_is_a_400(server):
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client(server[0]).chat.completions.create(
            model="fixture-model", messages=[{"role": "wizard", "content": "hi"}], max_tokens=4)
    assert refused.value.body["param"] == "messages[0].role"


def test_a_streamed_request_that_fails_validation_gets_its_status_before_any_event(server):
    client, served = server
    original = served.llm.config.max_all_tokens
    served.llm.set_config({"max_all_tokens": 16})
    try:
        with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
            response.read()
        with pytest.raises(openai.BadRequestError) as refused:
            openai_client(client).chat.completions.create(model="fixture-model", stream=True, **CHAT)
    finally:
        served.llm.set_config({"max_all_tokens": original})
    assert_openai_error(response, 400)
    assert not response.headers["content-type"].startswith("text/event-stream")
    assert refused.value.body["code"] == "context_length_exceeded"


def test_max_queue_counts_the_waiting_requests_not_the_running_one():
    from mnngpu.apps.server.protocol import ApiError, GenerationRequest
    from mnngpu.errors import InputError

    served = ServedModel(load_model(), "queue-model", max_queue=1)
    generating, release = threading.Event(), threading.Event()
    first = served.new_job(RAW_PROMPT, GenerationRequest(max_tokens=4))
    first.on_text = lambda piece: (generating.set(), release.wait(WAIT_S))
    try:
        futures = [served.submit(first)]
        assert generating.wait(WAIT_S)
        futures.append(served.submit(served.new_job(RAW_PROMPT, GenerationRequest(max_tokens=4))))  # waits
        with pytest.raises(ApiError) as refused:
            served.submit(served.new_job(RAW_PROMPT, GenerationRequest(max_tokens=4)))
        assert refused.value.status == 503
    finally:
        release.set()
    assert [f.result(WAIT_S).choices[0].finish_reason for f in futures] == ["length", "length"]
    served.close()
    with pytest.raises(InputError):
        ServedModel(served.llm, "no-queue", max_queue=0)


def test_serve_names_the_model_by_its_folder_logs_each_request_and_stops_on_ctrl_c():
    import signal

    from tests.reference_model import MODEL_DIR

    # sampled replies never meet a stop token here, so only the signal can end the long stream
    server = ServeProcess("--sampler", "mixed", "--config", "banned_tokens=[0,1,2]", "--config", "max_all_tokens=30000")
    try:
        model = server.api.models.retrieve(MODEL_DIR.name)
        assert model.created == int(MODEL_DIR.stat().st_mtime)
        reply = server.api.chat.completions.create(model=MODEL_DIR.name, **CHAT)
        with pytest.raises(openai.BadRequestError):
            server.api.chat.completions.create(model=MODEL_DIR.name, messages=[{"role": "robot", "content": "x"}])
        stream = server.api.completions.create(model=MODEL_DIR.name, prompt=RAW_PROMPT, max_tokens=20000,
                                               stream=True, seed=1)
        chunks = [next(stream)]
        server.signal(signal.SIGINT)
        chunks += list(stream)  # the stream ends with its final event
        code, log = server.finish()
    finally:
        server.kill()
    assert reply.choices[0].message.content == expected_chat()[1]
    assert chunks[-1].choices[0].finish_reason == "cancelled" and len(chunks) < 20000
    assert code == 0 and log.endswith("stopped\n") and "Traceback" not in log
    tokens = reply.usage.completion_tokens
    assert f'"GET /v1/models/{MODEL_DIR.name} HTTP/1.1" 200 OK ' in log
    assert f'"POST /v1/chat/completions HTTP/1.1" 200 OK {tokens} tokens ' in log
    assert '"POST /v1/chat/completions HTTP/1.1" 400 Bad Request ' in log
    assert re.search(r"WARNING: .*400 expected a role in", log)
    assert '"POST /v1/completions HTTP/1.1" 200 OK ' in log


def test_serve_quiet_logs_no_request_and_a_second_signal_exits_at_once():
    import signal

    server = ServeProcess("--quiet")
    try:
        server.api.models.list()
        # A request still arriving holds uvicorn's graceful stop open, so the second signal decides.
        with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) as raw:
            raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\n{")
            server.signal(signal.SIGTERM)
            assert server.line().startswith("stopping (SIGTERM)")
            server.signal(signal.SIGTERM)
            code, log = server.finish()
    finally:
        server.kill()
    assert code == 130 and "stopped at once (SIGTERM again)" in log
    assert "Traceback" not in log and "HTTP/1.1" not in log


@pytest.mark.parametrize(("flags", "message"), [
    (["--port", "99999"], "--port: expected a port number from 0 to 65535, got 99999"),
    (["--max-queue", "0"], "--max-queue: expected a positive integer, got 0"),
    (["--max-queue", "-3"], "--max-queue: expected a positive integer, got -3"),
    (["--max-body-bytes", "0"], "--max-body-bytes: expected a positive integer, got 0"),
])
def test_serve_refuses_bad_flags_in_one_line(capsys, flags, message):
    from mnngpu.apps.cli import main

    assert main(["serve", *flags]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_serve_on_a_port_in_use_says_so_in_one_line_and_never_says_serving():
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "mnngpu", "serve", "--port", str(port)], capture_output=True,
                              text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 2
    assert done.stderr == f"error: --port: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_a_folder_that_speculates_is_told_the_server_decodes_one_token_per_forward():
    """The server's decode step is one token per forward: a speculative_type in the folder is said once
    at load, naming the key, never quietly dropped; a folder without one says nothing."""
    import warnings

    from mnngpu.config.llm_config import ConfigWarning

    for speculative, expected in (("lookahead", 1), ("", 0)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            served = ServedModel(load_model(speculative_type=speculative) if speculative else load_model(), "m")
        try:
            said = [w for w in caught if issubclass(w.category, ConfigWarning) and "speculative_type" in str(w.message)]
            assert len(said) == expected
            if expected:
                assert "'lookahead'" in str(said[0].message) and "one token per forward" in str(said[0].message)
        finally:
            served.close()
