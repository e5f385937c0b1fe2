"""`python -m mnngpu.apps.server.ray_serve`: two replicas of the demo model on a local Ray cluster,
behind one OpenAI endpoint.

Truths: the `openai` client's parsing of every reply; the same model's greedy replies from mnngpu
run in this process; each reply's x-mnngpu-replica header, which Ray's replica context names.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.serving import WAIT_S, ServeProcess

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'mnngpu[ray]')")
openai = pytest.importorskip("openai")

REPLICAS = 2
PROMPTS = ["Once upon a time", "The little dog", "One day, Tom", "Mia found a"]
NEW_TOKENS = 12
STORY_REQUEST = [{"role": "user", "content": "Once upon a time"}]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RayServeProcess(ServeProcess):
    """The module as a user starts it, on a Ray cluster of its own (`--address local`), with a
    replica small enough for two to fit on one core."""

    def __init__(self, port: int):
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mnngpu.apps.server.ray_serve", "--replicas", str(REPLICAS), "--address", "local",
             "--port", str(port), "--threads", "1", "--cpus-per-replica", "0.5", "--sampler", "greedy"],
            stderr=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read_stderr, daemon=True)
        self.reader.start()
        self.log: list[str] = []
        try:
            while not (line := self.line()).startswith(f"serving {REPLICAS} replicas on "):
                assert line, "".join(self.log)
        except BaseException:
            self.kill()
            raise
        self.port = port
        self.api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                                 timeout=WAIT_S)

    def kill(self) -> None:
        """Ctrl-C first, so that the command stops the Ray cluster it started; then SIGKILL."""
        if self.process.poll() is None:
            self.signal(signal.SIGINT)
            try:
                self.process.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                super().kill()


@pytest.fixture(scope="module")
def cluster():
    server = RayServeProcess(free_port())
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def local():
    """The demo model in this process, as `mnngpu run` loads it."""
    from mnngpu import llm
    from mnngpu.demo import demo_model_dir

    model = llm.create(demo_model_dir() / "config.json")
    model.set_config({"thread_num": 1, "sampler_type": "greedy"})
    model.load()
    return model


def local_completion(model, prompt: str) -> str:
    model.reset()
    decoder = model.tokenizer.stream_decoder()
    ids = model.generate(model.tokenizer_encode(prompt), NEW_TOKENS)
    return "".join(decoder.feed(token) for token in ids) + decoder.flush()


def completion(api, prompt: str) -> tuple[str, str]:
    """The reply's text and the replica that wrote it."""
    raw = api.completions.with_raw_response.create(model="model", prompt=prompt, max_tokens=NEW_TOKENS,
                                                   temperature=0)
    return raw.parse().choices[0].text, raw.headers["x-mnngpu-replica"]


def test_both_replicas_serve_the_local_greedy_replies(cluster, local):
    expected = {prompt: local_completion(local, prompt) for prompt in PROMPTS}
    replicas: set[str] = set()
    with ThreadPoolExecutor(REPLICAS) as clients:
        for _ in range(10):   # two at a time: the router sends the second to the replica with less to do
            for prompt, (text, replica) in zip(PROMPTS, clients.map(lambda p: completion(cluster.api, p), PROMPTS)):
                assert text == expected[prompt], (prompt, replica)
                replicas.add(replica)
            if len(replicas) == REPLICAS:
                break
    assert len(replicas) == REPLICAS, f"only {replicas} answered"


def test_a_streamed_chat_reply_is_the_local_reply(cluster, local):
    local.reset()
    expected = local.response(STORY_REQUEST)
    stream = cluster.api.chat.completions.create(model="model", messages=STORY_REQUEST, stream=True, temperature=0)
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert len([p for p in pieces if p]) > 1, "the reply came as one event"
    assert "".join(pieces) == expected


def test_models_and_health_answer_through_the_proxy(cluster):
    assert [model.id for model in cluster.api.models.list().data] == ["mnngpu-demo"]
    health = httpx.get(f"http://127.0.0.1:{cluster.port}/health", timeout=WAIT_S)
    assert (health.status_code, health.json()) == (200, {"status": "ok"})

def test_ctrl_c_stops_the_replicas_and_the_cluster(cluster):
    import psutil  # a dependency of ray's

    started = psutil.Process(cluster.process.pid).children(recursive=True)   # Ray's daemons and workers
    assert len(started) > REPLICAS
    cluster.signal(signal.SIGINT)
    code, log = cluster.finish()
    assert code == 0, log
    assert log.rstrip().endswith("stopped"), log
    _, alive = psutil.wait_procs(started, timeout=WAIT_S)
    assert not alive, [process.cmdline() for process in alive]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", cluster.port), timeout=5).close()
