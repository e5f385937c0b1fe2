"""The OpenAI-compatible HTTP app (Starlette): chat completions, completions, the model list, and the
endpoints an operator or an evaluation harness uses, over one model or several (models.py).

    POST /v1/chat/completions   {"messages": [...], "stream": false, "max_tokens": 64, ...}
    POST /v1/completions        {"prompt": "..." | [...] | [ids] | [[ids], ...], "echo": true, "logprobs": 1, ...}
    POST /v1/messages           Anthropic's Messages API (anthropic_messages.py), translated onto the chat route
    POST /v1/messages/count_tokens   {"messages": [...], ...} -> {"input_tokens": n}
    POST /v1/responses          OpenAI's Responses API (openai_responses.py), translated onto the chat route
    GET  /v1/responses/{id}     a stored response
    GET  /v1/models, /v1/models/{id}   each model, with its `state` (loaded, loading, unloaded, failed)
    GET  /health                200 {"status": "ok"} once the (first) model is loaded, 503 while it loads or stops
    POST /tokenize              {"prompt": "..."} or {"messages": [...]} -> {"tokens": [...], "count": n}
    POST /detokenize            {"tokens": [...]} -> {"prompt": "..."}
    GET  /tokenizer_info        eos and bos tokens, stop ids, the chat template (?model=NAME picks the model)
    GET  /metrics               Prometheus's text format: requests, tokens, queue, KV cache, latencies
    POST /v1/embeddings         an embedding model's vectors (embeddings.py)
    POST /v1/rerank, /rerank    a reranker's scores (rerank.py)
    GET  /                      the chat page (page/index.html), a client of the routes above

Every route that runs a model picks it with `await api.model_for(requested)`: `requested` is the
body's `model` field (a GET route's `?model=` query parameter), and the ServedModel it gives is
loaded first if it was not (the request waits), or the request is refused with the status that
says why (404 `model_not_found` naming the served models, 503 while the first model loads, 500
`model_load_failed`); with one model served, any name picks it. A route awaits nothing between
model_for and submitting its job, so the model cannot be unloaded under it (models.py). A new
route does the same: read the body, `served = await self.model_for(body.get("model"))`, then run;
a route that awaits while it uses the model outside its job queue (on a thread, say) holds it for
that time instead: `async with self.models.held(body.get("model")) as served: ...`.

Chat requests may ask for structured output (`response_format`, run by structured.py) and offer
tools (tool_calls.py). A streamed reply is a server-sent event per piece of text (or of a tool
call), then `data: [DONE]`. Request bodies larger than `max_body_bytes` get 413, bodies nested
deeper than MAX_JSON_DEPTH get 400, an unknown path gets 404 listing the routes; any refused
request gets a 4xx with an OpenAI-style `{"error": {"message", "type", "param", "code"}}` body; a
streamed request is checked before its stream starts, so it gets its 4xx status too (the
Messages routes answer in Anthropic's error shape, `{"type": "error", "error": {...}}`). Every
request makes one access line (logger "mnngpu.access") and is counted in /metrics once its
status is sent, every failure makes an error line (logger "mnngpu.server").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from http import HTTPStatus
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mnngpu.apps.server import anthropic_messages, embeddings, openai_responses, rerank
from mnngpu.apps.server.choice import Piece
from mnngpu.apps.server.engine import Job, Result, ServedModel
from mnngpu.apps.server.kinds import EMBEDDING, LLM, RERANKER, listing, require_kind
from mnngpu.apps.server.metrics import ServerMetrics
from mnngpu.apps.server.models import ModelSlot, ServedModels
from mnngpu.apps.server.page import chat_page
from mnngpu.apps.server.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    ApiError,
    GenerationRequest,
    error_body,
    for_template,
    parse_chat_request,
    parse_completion_request,
)
from mnngpu.apps.server.replies import ResponseShape
from mnngpu.apps.server.tokens import detokenize, tokenize
from mnngpu.apps.server.translation import ParamMap, renamed
from mnngpu.errors import MnnGpuError


def create_app(served: ServedModel | ServedModels, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Starlette:
    """The app over a loaded model, or over ServedModels: several, or a ModelSlot that gets its one
    model once it has loaded."""
    models = served if isinstance(served, ServedModels) else ModelSlot(served)
    routes: list[Route] = []
    metrics = ServerMetrics(routes, models)
    api = OpenAiApi(models, max_body_bytes, metrics)
    routes += [
        Route("/", chat_page, methods=["GET"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/messages", api.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", api.count_tokens, methods=["POST"]),
        Route("/v1/responses", api.responses, methods=["POST"]),
        Route("/v1/responses/{response_id}", api.response, methods=["GET"]),
        Route("/v1/models", api.list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", api.show_model, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/tokenize", api.tokenize, methods=["POST"]),
        Route("/detokenize", api.detokenize, methods=["POST"]),
        Route("/tokenizer_info", api.tokenizer_info, methods=["GET"]),
        Route("/metrics", api.scrape, methods=["GET"]),
        Route("/v1/embeddings", api.embeddings, methods=["POST"]),
        Route("/v1/rerank", api.rerank, methods=["POST"]),
        Route("/rerank", api.rerank, methods=["POST"]),
    ]
    handlers = {ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        models.close()

    return AccessLog(Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan), metrics)


ACCESS_LOG = logging.getLogger("mnngpu.access")
ERROR_LOG = logging.getLogger("mnngpu.server")
TOKENS_KEY = "mnngpu.completion_tokens"  # where a request's scope records the tokens it generated


class AccessLog:
    """ASGI middleware: one line per HTTP request, once its response has ended, in uvicorn's
    access format plus the tokens generated and the time taken. The response is counted in
    /metrics as its status goes out, so a client that has the status can see the count."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = [500]
        counted = [False]

        async def send_and_note(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                self.metrics.count_response(scope, status[0])
                counted[0] = True
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            if not counted[0]:
                self.metrics.count_response(scope, status[0])
            client = scope.get("client") or ("-", 0)
            path = scope["path"] + (f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else "")
            tokens = scope.get(TOKENS_KEY)
            ACCESS_LOG.info('%s:%d - "%s %s HTTP/%s" %d %s%s %.2f s', client[0], client[1], scope["method"], path,
                            scope.get("http_version", "1.1"), status[0], _phrase(status[0]),
                            f" {tokens} tokens" if tokens is not None else "", time.perf_counter() - start)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class ReplyFormat(Protocol):
    """How a route shapes the chat route's reply (its chat.completion body) and stream (its chunks)."""

    def body(self, completion: dict, result: Result) -> dict: ...

    def events(self, chunks: AsyncIterator[dict], future: Future) -> AsyncIterator[str]: ...


class OpenAiReply:
    """Chat completions and completions: the body as it is, each chunk an event, then [DONE]."""

    def body(self, completion: dict, result: Result) -> dict:
        return completion

    async def events(self, chunks: AsyncIterator[dict], future: Future) -> AsyncIterator[str]:
        async for chunk in chunks:
            yield _event(chunk)
        yield "data: [DONE]\n\n"


OPENAI_REPLY = OpenAiReply()


class OpenAiApi:
    def __init__(self, models: ServedModels, max_body_bytes: int, metrics: ServerMetrics):
        self.models = models
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.stored = openai_responses.ResponseStore()

    async def model_for(self, requested: object, kind: str = LLM) -> ServedModel:
        """The loaded model a request names (see the module's docstring); a 400 naming its kind when
        it is not of the `kind` the route runs (kinds.py)."""
        served = await self.models.model_for(requested)
        require_kind(served, kind)
        return served

    def _entries(self) -> list:
        if self.models.first.name is None:   # a ModelSlot whose model has not loaded: its name is not known
            raise ApiError(503, "the model is still loading; GET /health answers 200 once it is ready",
                           kind="server_error", code="model_loading")
        return self.models.entries

    async def list_models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [listing(entry) for entry in self._entries()]})

    async def show_model(self, request: Request) -> JSONResponse:
        model_id = request.path_params["model_id"]
        entries = self._entries()
        for entry in entries:
            if entry.name == model_id:
                return JSONResponse(listing(entry))
        raise ApiError(404, f"no model '{model_id}' here; this server has "
                            f"{', '.join(repr(entry.name) for entry in entries)}",
                       param="model", kind="not_found_error", code="model_not_found")

    async def health(self, request: Request) -> JSONResponse:
        models = self.models
        status = "stopping" if models.stopping else "ok" if models.started else "loading"
        body = {"status": status}
        if models.several:
            body["models"] = {entry.name: entry.state for entry in models.entries}
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    async def scrape(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def tokenize(self, request: Request) -> JSONResponse:
        body = await read_json(request, self.max_body_bytes)
        served = await self.model_for(body.get("model"))
        return JSONResponse(tokenize(served.llm, body))

    async def detokenize(self, request: Request) -> JSONResponse:
        body = await read_json(request, self.max_body_bytes)
        served = await self.model_for(body.get("model"))
        return JSONResponse(detokenize(served.llm, body))

    async def tokenizer_info(self, request: Request) -> JSONResponse:
        served = await self.model_for(request.query_params.get("model"))
        return JSONResponse(served.tokenizer_info())

    async def chat_completions(self, request: Request) -> Response:
        body = await read_json(request, self.max_body_bytes)
        parsed = parse_chat_request(body)
        served = await self.model_for(body.get("model"))
        return await self._generate(request, served, parsed, [_chat_prompt(served, parsed)], chat=True)

    async def completions(self, request: Request) -> Response:
        body = await read_json(request, self.max_body_bytes)
        parsed = parse_completion_request(body)
        served = await self.model_for(body.get("model"))
        return await self._generate(request, served, parsed, parsed.prompts, chat=False)

    async def messages(self, request: Request) -> Response:
        try:
            body = await read_json(request, self.max_body_bytes)
            served = await self.model_for(body.get("model"))
            parsed, reply = anthropic_messages.parse(body, served.name)
            with _own_names(reply.params):
                prompt = _chat_prompt(served, parsed)
                if parsed.stream:
                    reply.input_tokens = _count(served, prompt, parsed)
                return await self._generate(request, served, parsed, [prompt], chat=True, reply=reply)
        except ApiError as exc:
            return _refused(request, exc, anthropic_messages.error_body(exc))

    async def count_tokens(self, request: Request) -> Response:
        try:
            body = await read_json(request, self.max_body_bytes)
            served = await self.model_for(body.get("model"))
            parsed, reply = anthropic_messages.parse(body, served.name, count_only=True)
            with _own_names(reply.params):
                return JSONResponse({"input_tokens": _count(served, _chat_prompt(served, parsed), parsed)})
        except ApiError as exc:
            return _refused(request, exc, anthropic_messages.error_body(exc))

    async def responses(self, request: Request) -> Response:
        body = await read_json(request, self.max_body_bytes)
        served = await self.model_for(body.get("model"))
        parsed, reply = openai_responses.parse(body, served.name, self.stored)
        with _own_names(reply.params):
            return await self._generate(request, served, parsed, [_chat_prompt(served, parsed)], chat=True,
                                        reply=reply)

    async def response(self, request: Request) -> JSONResponse:
        return JSONResponse(self.stored.find(request.path_params["response_id"]))

    async def embeddings(self, request: Request) -> JSONResponse:
        body = await read_json(request, self.max_body_bytes)
        served = await self.model_for(body.get("model"), EMBEDDING)
        return JSONResponse(await embeddings.create_embeddings(served, body))

    async def rerank(self, request: Request) -> JSONResponse:
        body = await read_json(request, self.max_body_bytes)
        served = await self.model_for(body.get("model"), RERANKER)
        return JSONResponse(await rerank.create_rerank(served, body))

    async def _generate(self, request: Request, served: ServedModel, parsed: GenerationRequest, prompts: list,
                        chat: bool, reply: ReplyFormat = OPENAI_REPLY) -> Response:
        job = served.new_job(prompts, parsed)
        shape = ResponseShape(chat, served.name, served.llm.tokenizer, parsed.logprobs is not None, parsed.tools)
        if parsed.stream:
            return _stream(served, request.scope, job, shape, reply)
        result = await _result_unless_gone(served, request, job)
        if result is None:
            return Response(status_code=499)  # nobody is listening any more
        request.scope[TOKENS_KEY] = result.usage.completion_tokens
        return JSONResponse(reply.body(shape.complete(result.choices, result.usage), result))


def _chat_prompt(served: ServedModel, parsed: GenerationRequest) -> str:
    parsed.messages = for_template(parsed.messages, served.chat_template())
    return served.chat_prompt(parsed.messages, parsed)


def _count(served: ServedModel, prompt: str, parsed: GenerationRequest) -> int:
    try:
        return served.llm.count_prompt_tokens(prompt, parsed.media)
    except MnnGpuError as exc:
        raise ApiError(400, str(exc), param="messages") from None


async def _result_unless_gone(served: ServedModel, request: Request, job: Job) -> Result | None:
    result = asyncio.wrap_future(served.submit(job))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if result.done():
        return result.result()
    job.cancel()
    return None


def _stream(served: ServedModel, scope: dict, job: Job, shape: ResponseShape, reply: ReplyFormat) -> Response:
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue = asyncio.Queue()
    job.on_text = lambda piece: loop.call_soon_threadsafe(pieces.put_nowait, piece)
    future = served.submit(job)  # a full queue is refused here, before any event is sent
    future.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, None))
    return JobStream(job, reply.events(_chunks(scope, shape, pieces, future, job.request.include_usage), future))


@contextlib.contextmanager
def _own_names(params: ParamMap):
    """A translated request's refusals name its own fields, not the chat request's."""
    try:
        yield
    except ApiError as exc:
        raise renamed(exc, params) from None


class JobStream(StreamingResponse):
    """Server-sent events of one job; however the response ends (done, client gone), the job stops."""

    def __init__(self, job: Job, events: AsyncIterator[str]):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


async def _chunks(scope: dict, shape: ResponseShape, pieces: asyncio.Queue, future: Future,
                  include_usage: bool) -> AsyncIterator[dict]:
    """The chat (or completions) stream's chunks; a failure after the status line has gone out
    ends them with an error body."""
    opened, finished = {0}, set()
    yield shape.first_chunk(0)
    while (piece := await pieces.get()) is not None:
        if piece.index not in opened:
            opened.add(piece.index)
            yield shape.first_chunk(piece.index)
        finished.update([piece.index] if piece.finish_reason else [])
        if (chunk := shape.chunk(piece)) is not None:
            yield chunk
    try:
        result = future.result()
    except ApiError as exc:
        ERROR_LOG.error("a streamed reply failed: %s", exc.message)
        yield exc.body()
    except Exception as exc:  # noqa: BLE001 (a bug: say so in the stream; the status line has gone out)
        ERROR_LOG.error("a streamed reply failed: internal error: %r", exc)
        yield error_body(f"internal error: {exc!r}", "server_error")
    else:
        scope[TOKENS_KEY] = result.usage.completion_tokens
        for choice in result.choices:   # a job cancelled before it started has sent no end
            if choice.index not in finished:
                yield shape.chunk(Piece(choice.index, finish_reason=choice.finish_reason))
        if include_usage:
            yield shape.usage_chunk(result.usage)


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


# The deepest nesting of arrays and objects a body may have, the body itself being level 1. Real
# bodies are shallow: a message's content part is at level 5; a tool's `parameters` schema starts at
# level 5 and a `response_format` json_schema's at level 4, and each nested object property adds 2
# (`properties`, then the property's schema), so a schema at OpenAI's own structured-output limit
# (10 levels of nesting) ends near level 25; 100 leaves room for twice that with an `anyOf` or
# array `items` on every level, and a 48-level object schema still fits. The cap keeps what walks a
# body afterwards (json.dumps, the schema and grammar compilers, the chat template), which recurse
# a few frames per level, far from Python's recursion limit (1,000 frames), where a body ~1,000
# levels deep (2 KB of `[`) ended in a RecursionError and a 500.
MAX_JSON_DEPTH = 100


async def read_json(request: Request, limit: int) -> dict:
    """The body as a JSON object, read no further than `limit` bytes and nested no deeper than
    MAX_JSON_DEPTH."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise _too_large(limit) if declared.isdigit() else ApiError(400, "Content-Length is not a number")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    except RecursionError:   # nested deeper than the decoder's stack allows, far past MAX_JSON_DEPTH
        raise _too_deep() from None
    if not isinstance(data, dict):
        raise ApiError(400, f"expected a JSON object, got {type(data).__name__}")
    if _deeper_than(data, MAX_JSON_DEPTH):
        raise _too_deep()
    return data


def _deeper_than(data: dict | list, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels in `data` (itself level 1); walked a
    level at a time, not recursively, so no depth can overflow the stack here."""
    level, depth = [data], 1
    while level:
        if depth > limit:
            return True
        level = [child for value in level for child in (value.values() if isinstance(value, dict) else value)
                 if isinstance(child, dict | list)]
        depth += 1
    return False


def _too_deep() -> ApiError:
    return ApiError(400, f"the body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep",
                    code="nested_too_deep")


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {limit} bytes", code="request_too_large")


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return _refused(request, exc, exc.body())


def _refused(request: Request, exc: ApiError, body: dict) -> JSONResponse:
    ERROR_LOG.warning("%s %s: %d %s", request.method, request.url.path, exc.status, exc.message)
    return JSONResponse(body, status_code=exc.status)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own refusals: no route for the path (404), or not for the method (405)."""
    if exc.status_code == 404:
        body = error_body(f"no route {request.method} {request.url.path}; this server has "
                          f"{', '.join(_route_names(request.app.routes))}", "not_found_error",
                          code="unknown_route")
    else:
        body = error_body(str(exc.detail), "invalid_request_error")
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def _route_names(routes: list) -> list[str]:
    """'POST /v1/completions', 'GET /v1/models/{model_id}', ... for each route, in the table's order."""
    names = []
    for route in routes:
        if isinstance(route, Route):
            path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)   # {model_id:path} -> {model_id}
            names.append(f"{'/'.join(sorted(route.methods - {'HEAD'}))} {path}")
    return names


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    ERROR_LOG.error("%s %s: internal error: %r", request.method, request.url.path, exc)
    return JSONResponse(error_body(f"internal error: {exc!r}", "server_error"), status_code=500)
