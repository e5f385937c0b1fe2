"""The OpenAI-compatible HTTP app (Starlette): chat completions, completions and the model list.

    POST /v1/chat/completions   {"messages": [...], "stream": false, "max_tokens": 64, ...}
    POST /v1/completions        {"prompt": "...", ...}
    GET  /v1/models

A streamed reply is a server-sent event per piece of text, then `data: [DONE]`. Request
bodies larger than `max_body_bytes` get 413; any refused request gets a 4xx with an
OpenAI-style `{"error": {"message", "type", "param", "code"}}` body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from concurrent.futures import Future

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mnngpu.server.engine import Job, Result, ServedModel
from mnngpu.server.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    ApiError,
    GenerationRequest,
    ResponseShape,
    error_body,
    parse_chat_request,
    parse_completion_request,
)


def create_app(served: ServedModel, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Starlette:
    api = OpenAiApi(served, max_body_bytes)
    routes = [
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
    ]
    handlers = {ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        served.close()

    return Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)


class OpenAiApi:
    def __init__(self, served: ServedModel, max_body_bytes: int):
        self.served = served
        self.max_body_bytes = max_body_bytes

    async def models(self, request: Request) -> JSONResponse:
        model = {"id": self.served.name, "object": "model", "created": 0, "owned_by": "mnngpu"}
        return JSONResponse({"object": "list", "data": [model]})

    async def chat_completions(self, request: Request) -> Response:
        parsed = parse_chat_request(await read_json(request, self.max_body_bytes))
        prompt = self.served.chat_prompt(parsed.messages)
        return await self._generate(request, parsed, prompt, ResponseShape(True, self.served.name))

    async def completions(self, request: Request) -> Response:
        parsed = parse_completion_request(await read_json(request, self.max_body_bytes))
        return await self._generate(request, parsed, parsed.prompt, ResponseShape(False, self.served.name))

    async def _generate(self, request: Request, parsed: GenerationRequest, prompt: str,
                        shape: ResponseShape) -> Response:
        job = self.served.new_job(prompt, parsed)
        if parsed.stream:
            return self._stream(job, shape)
        result = await self._result_unless_gone(request, job)
        if result is None:
            return Response(status_code=499)  # nobody is listening any more
        return JSONResponse(shape.complete(result.text, result.finish_reason, result.usage))

    async def _result_unless_gone(self, request: Request, job: Job) -> Result | None:
        result = asyncio.wrap_future(self.served.submit(job))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if result.done():
            return result.result()
        job.cancel()
        return None

    def _stream(self, job: Job, shape: ResponseShape) -> Response:
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()
        job.on_text = lambda piece: loop.call_soon_threadsafe(pieces.put_nowait, piece)
        future = self.served.submit(job)  # a full queue is refused here, before any event is sent
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, None))
        return JobStream(job, _events(shape, pieces, future, job.request.include_usage))


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


async def _events(shape: ResponseShape, pieces: asyncio.Queue, future: Future,
                  include_usage: bool) -> AsyncIterator[str]:
    yield _event(shape.chunk(first=True))
    while (piece := await pieces.get()) is not None:
        yield _event(shape.chunk(piece))
    try:
        result = future.result()
    except ApiError as exc:
        yield _event(exc.body())
    except Exception as exc:  # noqa: BLE001 (a bug: say so in the stream; the status line has gone out)
        yield _event(error_body(f"internal error: {exc!r}", "server_error"))
    else:
        yield _event(shape.chunk(finish_reason=result.finish_reason))
        if include_usage:
            yield _event(shape.usage_chunk(result.usage))
    yield "data: [DONE]\n\n"


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def read_json(request: Request, limit: int) -> dict:
    """The body as a JSON object, read no further than `limit` bytes."""
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
    if not isinstance(data, dict):
        raise ApiError(400, f"expected a JSON object, got {type(data).__name__}")
    return data


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {limit} bytes", code="request_too_large")


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(error_body(f"internal error: {exc!r}", "server_error"), status_code=500)
