"""The server as the HTTP tests run it: a Starlette app under uvicorn on a free port of 127.0.0.1,
in a thread of the test process, or `mnngpu serve` as a user starts it (ServeProcess), and clients
for them (httpx, and the `openai` package)."""

from __future__ import annotations

import contextlib
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import uvicorn

WAIT_S = 120  # generous bounds on waits that should end at once; no assertion is timed


@contextlib.contextmanager
def running(app) -> Iterator[httpx.Client]:
    """An httpx client for `app`, served by uvicorn until the block ends."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise AssertionError("the server did not start")
        thread.join(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=WAIT_S) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(WAIT_S)


def openai_client(client: httpx.Client):
    """An `openai.OpenAI` client for the server `client` talks to."""
    import openai

    url = client.base_url
    return openai.OpenAI(base_url=f"http://{url.host}:{url.port}/v1", api_key="unused", max_retries=0,
                         timeout=WAIT_S)


class ServeProcess:
    """`mnngpu serve` on a free port of 127.0.0.1, as a user runs it."""

    def __init__(self, *extra: str, model_dir=None):
        """`model_dir`: the model folder to serve (the fixture model when None)."""
        import openai

        from tests.reference_model import CLI_ORACLE_FLAGS, MODEL_DIR

        self.process = subprocess.Popen(
            [sys.executable, "-m", "mnngpu", "serve", str(model_dir or MODEL_DIR), *CLI_ORACLE_FLAGS, "--sampler",
             "greedy",
             "--port", "0", *extra], stderr=subprocess.PIPE, text=True)
        # stderr is read by a thread, so that every wait on the server has a bound and a hung server
        # fails its test instead of stalling the run
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read_stderr, daemon=True)
        self.reader.start()
        self.log: list[str] = []
        while not (line := self.line()).startswith("serving "):
            assert line, "".join(self.log)
        self.port = int(re.search(r":(\d+)/v1 ", line).group(1))
        self.api = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0,
                                 timeout=WAIT_S)

    def _read_stderr(self) -> None:
        for line in self.process.stderr:
            self.lines.put(line)
        self.lines.put("")   # end of stream

    def line(self) -> str:
        """The server's next stderr line ("" at its end), kept in the log; fails after WAIT_S."""
        try:
            line = self.lines.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"no stderr line from the server in {WAIT_S} s; so far:\n{''.join(self.log)}")
        self.log.append(line)
        return line

    def signal(self, number: int) -> None:
        self.process.send_signal(number)

    def finish(self) -> tuple[int, str]:
        code = self.process.wait(WAIT_S)
        while self.line():
            pass
        return code, "".join(self.log)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(WAIT_S)
