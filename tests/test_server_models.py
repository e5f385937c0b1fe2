"""Several models in one server (`mnngpu serve A B ...`): the request's `model` picks one, each loads
on first use, `--models-max` unloads the least recently used idle one, and its memory comes back.

Truths: MNN's recorded greedy tokens for each fixture's prompts (reference.json), decoded with the
fixture's HF tokenizer, up to the first of HF's special tokens where the reply says it stopped;
the process's resident memory from /proc/self/status (Linux's own count).
"""

from __future__ import annotations

import gc
import json
import re
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from tokenizers import Tokenizer

from mnngpu.apps.cli import build_parser
from mnngpu.apps.commands.serve import served_models
from mnngpu.apps.server.app import create_app
from tests.conftest import FIXTURES
from tests.reference_model import CLI_ORACLE_FLAGS
from tests.serving import WAIT_S, running

FIRST, SECOND, THIRD = "qwen2_int4_b64", "qwen3_int4_b64", "llama_int4_b0"
GREEDY_TOKENS = 16   # MNN's recorded run of each prompt


def serve_args(*models: str, extra: tuple[str, ...] = ()):
    """`mnngpu serve MODEL... FLAGS` as the command line parses it, with the settings MNN's runs used."""
    return build_parser("serve").parse_args(
        ["serve", *models, *CLI_ORACLE_FLAGS, "--sampler", "greedy", "--quiet", *extra])


def started(*models: str, extra: tuple[str, ...] = ()):
    """The server's models, the first loaded as `mnngpu serve` loads it at start."""
    models = served_models(serve_args(*models, extra=extra))
    models.load_first()
    return models


def recorded_replies(name: str) -> list[tuple[list[int], dict[str, str]]]:
    """Each recorded prompt's ids, and MNN's greedy reply's text by how it ends: all 16 tokens
    ("length"), or up to its first special token ("stop")."""
    folder = FIXTURES / name
    hf = Tokenizer.from_file(str(folder / "hf" / "tokenizer.json"))
    specials = {token_id for token_id, token in hf.get_added_tokens_decoder().items() if token.special}
    replies = []
    for prompt in json.loads((folder / "reference.json").read_text())["prompts"]:
        greedy = prompt["greedy"][:GREEDY_TOKENS]
        cut = next((i for i, token in enumerate(greedy) if token in specials), None)
        ends = {"length": hf.decode(greedy)}
        if cut is not None:
            ends = {"stop": hf.decode(greedy[:cut])}
        replies.append((prompt["ids"], ends))
    return replies


def completion(client, model: str, ids: list[int]) -> dict[str, str]:
    """The greedy reply to `ids`, by how it ended (as recorded_replies gives MNN's)."""
    response = client.post("/v1/completions", json={"model": model, "prompt": ids, "max_tokens": GREEDY_TOKENS,
                                                    "temperature": 0})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return {choice["finish_reason"]: choice["text"]}


def rss_mb() -> float:
    return int(re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) / 1024


def states(client) -> dict[str, str]:
    return {model["id"]: model["state"] for model in client.get("/v1/models").json()["data"]}


def test_two_models_under_concurrent_requests_each_give_their_own_greedy_replies():
    folders = [str(FIXTURES / FIRST), str(FIXTURES / SECOND)]
    with running(create_app(started(*folders))) as client:
        assert states(client) == {FIRST: "loaded", SECOND: "unloaded"}
        asks = [(name, ids, text) for name in (FIRST, SECOND) for ids, text in recorded_replies(name)]
        with ThreadPoolExecutor(len(asks)) as pool:
            replies = list(pool.map(lambda ask: completion(client, ask[0], ask[1]), asks))
        assert replies == [text for _, _, text in asks]
        assert states(client) == {FIRST: "loaded", SECOND: "loaded"}
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["models"] == {FIRST: "loaded", SECOND: "loaded"}
        metrics = client.get("/metrics").text
        for name in (FIRST, SECOND):
            assert f'mnngpu_slots{{model="{name}"}}' in metrics


def test_an_unknown_model_gets_404_naming_the_served_ones():
    with running(create_app(started(str(FIXTURES / FIRST), str(FIXTURES / SECOND)))) as client:
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/completions", {"prompt": "hi"}), ("/tokenize", {"prompt": "hi"}),
                           ("/v1/responses", {"input": "hi"})):
            response = client.post(path, json={"model": "nope", **body})
            error = response.json()["error"]
            assert response.status_code == 404 and error["code"] == "model_not_found", path
            assert error["param"] == "model" and FIRST in error["message"] and SECOND in error["message"]
        messages = client.post("/v1/messages", json={"model": "nope", "max_tokens": 4,
                                                     "messages": [{"role": "user", "content": "hi"}]})
        assert messages.status_code == 404 and messages.json()["type"] == "error"
        assert client.get("/v1/models/nope").status_code == 404
        assert client.get(f"/v1/models/{SECOND}").json()["state"] == "unloaded"
        assert client.get("/tokenizer_info", params={"model": "nope"}).status_code == 404
        assert client.get(f"/tokenizer_info?model={SECOND}").json()["model"] == SECOND   # loaded now
        assert client.get(f"/v1/models/{SECOND}").json()["state"] == "loaded"
        assert client.get("/tokenizer_info").json()["model"] == FIRST   # none named: the first


def test_one_model_answers_any_model_name_as_before():
    with running(create_app(started(str(FIXTURES / FIRST)))) as client:
        ids, reply = recorded_replies(FIRST)[0]
        assert completion(client, "whatever-the-client-says", ids) == reply
        assert client.get("/health").json() == {"status": "ok"}
        assert "model=" not in client.get("/metrics").text


def test_a_third_model_past_models_max_unloads_the_idle_least_recently_used_and_its_memory_returns():
    models = started(*(str(FIXTURES / name) for name in (FIRST, SECOND, THIRD)), extra=("--models-max", "2"))
    with running(create_app(models)) as client:
        replies = {name: recorded_replies(name)[0] for name in (FIRST, SECOND, THIRD)}
        for name in (SECOND, THIRD, FIRST, SECOND, THIRD):   # every model loaded and run twice: warm
            assert completion(client, name, replies[name][0]) == replies[name][1]
        assert states(client) == {FIRST: "unloaded", SECOND: "loaded", THIRD: "loaded"}
        cost = _load_cost(models.entries[0].load)
        before = rss_mb()
        assert completion(client, FIRST, replies[FIRST][0]) == replies[FIRST][1]
        grown = rss_mb() - before
        assert states(client) == {FIRST: "loaded", SECOND: "unloaded", THIRD: "loaded"}   # SECOND was used least
    assert cost > 2.0, f"a model's load costs {cost:.1f} MB: too little to see it come back"
    print(f"one model: {cost:.1f} MB; RSS grew {grown:.2f} MB as it took the unloaded one's place")
    assert grown < cost / 3, f"loading {FIRST} in {SECOND}'s place grew RSS {grown:.1f} MB; one model is {cost:.1f} MB"


def _load_cost(load) -> float:
    """How much resident memory one more loaded model takes, now that the code is warm."""
    before = rss_mb()
    served = load()
    cost = rss_mb() - before
    served.close()
    del served
    gc.collect()
    return cost


def test_a_model_that_fails_to_load_gets_a_clear_error_and_the_others_go_on(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(FIXTURES / SECOND, broken)
    (broken / "llm.mnn").write_bytes(b"not a flatbuffer")
    with running(create_app(started(str(FIXTURES / FIRST), str(broken)))) as client:
        for _ in range(2):   # the failure stays; the second request gets it without a second load
            response = client.post("/v1/completions", json={"model": "broken", "prompt": "hi", "max_tokens": 2})
            error = response.json()["error"]
            assert response.status_code == 500 and error["code"] == "model_load_failed"
            assert "broken" in error["message"] and "llm.mnn" in error["message"]
        assert states(client) == {FIRST: "loaded", "broken": "failed"}
        assert client.get("/health").status_code == 200
        ids, reply = recorded_replies(FIRST)[0]
        assert completion(client, FIRST, ids) == reply


def test_serve_takes_several_models_and_a_models_dir_and_refuses_what_cannot_be_served(tmp_path):
    for name in (FIRST, SECOND):
        (tmp_path / name).symlink_to(FIXTURES / name)
    (tmp_path / "notes").mkdir()   # no config.json: not a model
    models = served_models(serve_args(str(FIXTURES / THIRD), extra=("--models-dir", str(tmp_path))))
    assert models.names() == [THIRD, FIRST, SECOND]
    refused = [(("--model-name", "x", "--models-dir", str(tmp_path)), "--model-name"),
               (("--models-dir", str(tmp_path / "notes")), "--models-dir"),
               (("--models-dir", str(FIXTURES / FIRST / "config.json")), "--models-dir")]
    for extra, field in refused:
        process = subprocess.run([sys.executable, "-m", "mnngpu", "serve", *extra, "--port", "0"],
                                 capture_output=True, text=True, timeout=WAIT_S)
        assert process.returncode == 2 and field in process.stderr, process.stderr
    twice = subprocess.run([sys.executable, "-m", "mnngpu", "serve", str(FIXTURES / FIRST), str(tmp_path / FIRST)],
                           capture_output=True, text=True, timeout=WAIT_S)
    assert twice.returncode == 2 and f"both named '{FIRST}'" in twice.stderr


def test_when_every_loaded_model_is_busy_another_gets_503_until_one_is_idle():
    from mnngpu.apps.server.protocol import parse_completion_request

    models = started(str(FIXTURES / FIRST), str(FIXTURES / SECOND), extra=("--models-max", "1"))
    served = models.first.served
    holding, release = threading.Event(), threading.Event()

    def hold(piece) -> None:
        holding.set()
        release.wait(WAIT_S)

    with running(create_app(models)) as client:
        job = served.new_job("hello", parse_completion_request({"prompt": "hello", "max_tokens": 2}))
        job.on_text = hold
        future = served.submit(job)
        try:
            assert holding.wait(WAIT_S)
            refused = client.post("/v1/completions", json={"model": SECOND, "prompt": "hi", "max_tokens": 2})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "models_busy"
            assert states(client) == {FIRST: "loaded", SECOND: "unloaded"}
        finally:
            release.set()
        future.result(WAIT_S)
        ids, reply = recorded_replies(SECOND)[0]
        assert completion(client, SECOND, ids) == reply
        assert states(client) == {FIRST: "unloaded", SECOND: "loaded"}


def test_ray_serve_refuses_several_models_with_one_clear_error():
    pytest.importorskip("ray")
    process = subprocess.run([sys.executable, "-m", "mnngpu.apps.server.ray_serve", str(FIXTURES / FIRST),
                              str(FIXTURES / SECOND), "--port", "8000"], capture_output=True, text=True, timeout=WAIT_S)
    assert process.returncode == 2 and process.stderr.startswith("error: model: serves one model on Ray Serve")


def test_a_model_held_by_a_route_is_not_idle_so_it_is_not_unloaded():
    import asyncio

    from mnngpu.apps.server.protocol import ApiError

    models = started(str(FIXTURES / FIRST), str(FIXTURES / SECOND), extra=("--models-max", "1"))

    async def load_second_while_first_is_held() -> str:
        async with models.held(FIRST) as served:
            assert served is models.first.served
            try:
                await models.model_for(SECOND)
            except ApiError as exc:
                return exc.code
        return "loaded"

    try:
        assert asyncio.run(load_second_while_first_is_held()) == "models_busy"
        assert asyncio.run(models.model_for(SECOND)).name == SECOND   # idle once the block ended
        assert [entry.state for entry in models.entries] == ["unloaded", "loaded"]
    finally:
        models.close()


def test_an_embedding_model_and_a_chat_model_sit_side_by_side():
    embedding = FIXTURES.parent / "retrieval" / "qwen3_embedding"
    recorded = json.loads((embedding / "embedding_reference.json").read_text())["prompts"][0]
    truth = np.asarray(recorded["embedding"], dtype=np.float64).ravel()
    with running(create_app(started(str(FIXTURES / FIRST), str(embedding)))) as client:
        vector = client.post("/v1/embeddings", json={"model": embedding.name, "input": recorded["text"]})
        assert vector.status_code == 200, vector.text
        got = np.asarray(vector.json()["data"][0]["embedding"], dtype=np.float64)
        assert got @ (truth / np.linalg.norm(truth)) >= 0.99999   # MNN's txt_embedding, at unit length
        ids, text = recorded_replies(FIRST)[0]
        assert completion(client, FIRST, ids) == text
        refused = client.post("/v1/chat/completions", json={"model": embedding.name,
                                                            "messages": [{"role": "user", "content": "hi"}]})
        assert refused.status_code == 400 and "embedding model" in refused.json()["error"]["message"]
        kinds = {model["id"]: model.get("kind") for model in client.get("/v1/models").json()["data"]}
        assert kinds == {FIRST: "llm", embedding.name: "embedding"}
