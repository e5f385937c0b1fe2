"""The models one server serves, by name, each loaded on first use, at most `max_loaded` at once.

    models = ServedModels([ModelEntry("qwen2", load_qwen2), ModelEntry("qwen3", load_qwen3)], max_loaded=1)
    served = await models.model_for(body.get("model"))   # on the event loop: the ServedModel to run it on

A request's `model` names its model; with one model served, any name (or none) picks it, as a
server of one model always answered. With several, an unknown name gets 404 (`model_not_found`)
naming the served ones, and a request without a name gets the first. The first model is loaded at
start by whoever starts the server (`load_first`, on its own thread); until it is ready, requests
for it get 503 (`model_loading`) and GET /health answers 503. Every other model loads when a
request first names it, one load at a time on the loader thread, and the requests for a model
that is loading wait for it. A model whose load failed stays failed: each request for it gets 500
(`model_load_failed`) with the load's error, and the other models go on serving.

With `max_loaded`, a load that would pass the cap first unloads the least recently used model
that is idle (no request waiting or running on it): it is stopped and closed on the loader thread
before the new one loads, so its memory is returned first. When every loaded model is busy or
loading, the request gets 503 (`models_busy`). An unloaded model loads again when named again.

State lives on the event loop: entries change there, except a load's end, which the loader thread
writes as its last step. Between `model_for` and submitting a job the routes do not await, so no
unload can come between a request picking its model and the model counting it as busy. A route
that awaits while it uses a model outside the job queue (on a thread of its own, say) holds it
instead, `async with models.held(requested) as served:`, and the model is not idle until then.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from mnngpu.apps.server.protocol import ApiError

if TYPE_CHECKING:
    from mnngpu.apps.server.engine import ServedModel

LOADED, LOADING, UNLOADED, FAILED = "loaded", "loading", "unloaded", "failed"


class ModelEntry:
    """One served model: its name, how to load it, and its state (LOADED, LOADING, UNLOADED, FAILED)."""

    def __init__(self, name: str | None, load: Callable[[], ServedModel] | None = None, created: int = 0):
        self.name, self.load, self.created = name, load, created
        self.served: ServedModel | None = None
        self.state = UNLOADED if load is not None else LOADING
        self.failure: str | None = None
        self.pending: Future | None = None    # the last load on the loader thread (None: loaded at start)
        self.last_used = 0.0
        self.holds = 0   # routes using the model outside its job queue (ServedModels.held)

    def listing(self) -> dict:
        """The entry of GET /v1/models: OpenAI's model object, plus its `state`."""
        created = self.served.created if self.served is not None else self.created
        return {"id": self.name, "object": "model", "created": created, "owned_by": "mnngpu", "state": self.state}

    @property
    def idle(self) -> bool:
        served = self.served
        return (self.state == LOADED and served is not None and self.holds == 0 and served.waiting == 0
                and served.running == 0)


class ServedModels:
    def __init__(self, entries: list[ModelEntry], max_loaded: int | None = None):
        names = [entry.name for entry in entries]
        if not entries or len(set(names)) < len(names):
            raise ValueError(f"expected models with distinct names, got {names}")
        if max_loaded is not None and max_loaded < 1:
            raise ValueError(f"expected max_loaded of at least 1, got {max_loaded}")
        self.entries, self.max_loaded = entries, max_loaded
        self.first.state = LOADED if self.first.served is not None else LOADING   # see load_first
        self.stopping = False
        self.started = False   # the first model has loaded once: GET /health answers 200
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mnngpu-model-load")

    @property
    def several(self) -> bool:
        return len(self.entries) > 1

    @property
    def first(self) -> ModelEntry:
        return self.entries[0]

    def names(self) -> list[str]:
        return [entry.name for entry in self.entries]

    def loaded(self) -> list[ServedModel]:
        return [entry.served for entry in self.entries if entry.served is not None]

    def entry(self, requested: object) -> ModelEntry:
        """The entry a request's `model` names (any name, with one model served; the first, with none)."""
        if not self.several or requested is None:
            return self.first
        if not isinstance(requested, str):
            raise ApiError(400, f"expected a model name (a string), got {type(requested).__name__}", param="model")
        for entry in self.entries:
            if entry.name == requested:
                return entry
        raise ApiError(404, f"no model '{requested}' here; this server has {', '.join(map(repr, self.names()))}",
                       param="model", kind="not_found_error", code="model_not_found")

    async def model_for(self, requested: object) -> ServedModel:
        """The loaded model a request names, loaded first if it is not (the request waits for it)."""
        entry = self.entry(requested)
        while True:
            if self.stopping:
                raise ApiError(503, "the server is shutting down", kind="server_error", code="server_stopping")
            if entry.state == LOADED and entry.served is not None:
                entry.last_used = time.monotonic()
                return entry.served
            if entry.state == FAILED:
                raise ApiError(500, f"the model '{entry.name}' failed to load: {entry.failure}", param="model",
                               kind="server_error", code="model_load_failed")
            pending = self._start_load(entry) if entry.state == UNLOADED else entry.pending
            if pending is None:   # the first model, loading at start
                raise ApiError(503, "the model is still loading; GET /health answers 200 once it is ready",
                               kind="server_error", code="model_loading")
            await asyncio.shield(asyncio.wrap_future(pending))

    @contextlib.asynccontextmanager
    async def held(self, requested: object) -> AsyncIterator[ServedModel]:
        """The model a request names (as model_for gives it), kept loaded until the block ends."""
        entry = self.entry(requested)
        served = await self.model_for(requested)
        entry.holds += 1
        try:
            yield served
        finally:
            entry.holds -= 1

    def _start_load(self, entry: ModelEntry) -> Future:
        held = [other for other in self.entries if other.state in (LOADED, LOADING)]
        if self.max_loaded is not None and len(held) >= self.max_loaded:
            idle = [other for other in held if other.idle]
            if not idle:
                raise ApiError(503, f"{len(held)} models are loaded (the most this server holds) and each is busy "
                                    f"or loading, so '{entry.name}' cannot load now; try again later",
                               kind="server_error", code="models_busy")
            self._unload(min(idle, key=lambda other: other.last_used))
        entry.state, entry.failure = LOADING, None
        entry.pending = self._loader.submit(self._load, entry)
        return entry.pending

    def _unload(self, entry: ModelEntry) -> None:
        served, entry.served, entry.state = entry.served, None, UNLOADED
        served.stop()
        self._loader.submit(_close, [served])   # before the next load on the same thread

    def load_first(self) -> None:
        """Load the first model here, on the calling thread; raises the load's error."""
        failure = self._load(self.first)
        if failure is not None:
            raise failure

    def _load(self, entry: ModelEntry) -> BaseException | None:
        """Load `entry`; its failure, if it failed, is kept for the requests that name it and returned."""
        try:
            served = entry.load()
        except BaseException as exc:  # noqa: BLE001 (the requests for this model get it; the server goes on)
            entry.failure = " ".join(str(exc).split()) or type(exc).__name__
            entry.state = FAILED
            return exc
        self.ready(served, entry)
        return None

    def ready(self, served: ServedModel, entry: ModelEntry | None = None) -> None:
        """`served` is `entry`'s (the first model's by default) loaded model."""
        entry = entry or self.first
        if entry.name is None:
            entry.name = served.name
        entry.served, entry.last_used = served, time.monotonic()
        entry.state = LOADED
        if entry is self.first:
            self.started = True
        if self.stopping:
            served.stop()

    def stop(self) -> None:
        """Refuse new requests; the running ones end after their current token."""
        self.stopping = True
        for served in self.loaded():
            served.stop()

    def close(self) -> None:
        """Stop, let a load in flight end, and close every loaded model."""
        self.stop()
        self._loader.shutdown(wait=True)
        for served in self.loaded():
            served.close()


def _close(holder: list[ServedModel]) -> None:
    """Close an unloaded model and collect it, so its memory is returned before the next load (it
    comes in a list that this empties: the executor's own reference to the argument outlives the call)."""
    holder.pop().close()
    gc.collect()


class ModelSlot(ServedModels):
    """One model, given loaded (`served`) or later (`ready`); until then every request but GET /health
    gets 503 (`code: "model_loading"`), so a server can answer while its model loads."""

    def __init__(self, served: ServedModel | None = None):
        super().__init__([ModelEntry(None)])
        if served is not None:
            self.ready(served)

    @property
    def served(self) -> ServedModel | None:
        return self.first.served

    @property
    def model(self) -> ServedModel:
        if self.first.served is None:
            raise ApiError(503, "the model is still loading; GET /health answers 200 once it is ready",
                           kind="server_error", code="model_loading")
        return self.first.served
