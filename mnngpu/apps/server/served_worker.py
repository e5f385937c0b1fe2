"""ServedOnThread: a loaded model that is not an LLM (an embedding model, a reranker) as the server
holds a model (models.py): its name, its counts for /metrics, and one request at a time run on its
own thread, so the event loop keeps answering."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry, Counter

from mnngpu.apps.server.protocol import ApiError


class ServedMetrics:
    """A served model's part of /metrics: mnngpu_<kind>_requests, mnngpu_<kind>_<items> (the inputs
    embedded, the documents scored) and mnngpu_<kind>_tokens."""

    def __init__(self, kind: str, items: str, items_help: str, tokens_help: str):
        self.registry = CollectorRegistry()
        self.requests = Counter(f"mnngpu_{kind}_requests", f"{kind.capitalize()} requests run", registry=self.registry)
        self.items = Counter(f"mnngpu_{kind}_{items}", items_help, registry=self.registry)
        self.tokens = Counter(f"mnngpu_{kind}_tokens", tokens_help, registry=self.registry)

    def record(self, items: int, tokens: int) -> None:
        self.requests.inc()
        self.items.inc(items)
        self.tokens.inc(tokens)


class ServedOnThread:
    parallel = 1   # requests run at once (each runs all its inputs together)

    def __init__(self, model, name: str, metrics, created: int = 0):
        self.llm = model   # the name the routes read a served model's engine by
        self.name, self.created, self.metrics = name, created, metrics
        self.waiting = 0
        self.running = 0
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"mnngpu-{self.kind}")
        self._stopping = False

    async def run(self, work: Callable, *args):
        """work(*args) on the model's thread, after the requests before it."""
        if self._stopping:
            raise ApiError(503, "the server is shutting down", kind="server_error", code="server_stopping")
        self.waiting += 1
        try:
            return await asyncio.wrap_future(self._worker.submit(self._timed, work, args))
        finally:
            self.waiting -= 1

    def _timed(self, work: Callable, args: tuple):
        with self._lock:
            self.running += 1
            try:
                return work(*args)
            finally:
                self.running -= 1

    def stop(self) -> None:
        self._stopping = True

    def close(self) -> None:
        self.stop()
        self._worker.shutdown(wait=True)
