"""The OpenAI wire format: request bodies checked into dataclasses, and the JSON that goes back.

Only what the engine can honour is read: `messages` (text and, for a vision model, image_url parts
given as data: URLs; for an audio model, input_audio parts holding base64 WAV data) or `prompt`, `max_tokens`
(`max_completion_tokens`), `temperature`, `top_p`, `seed`, `stop`, `stream` and
`stream_options.include_usage`. Other fields OpenAI clients send are ignored; `n` other
than 1 is refused, since one reply is generated per request.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

MAX_STOP_STRINGS = 4
ROLES = ("system", "user", "assistant")
DEFAULT_MAX_BODY_BYTES = 1 << 20


class ApiError(Exception):
    """A request the server refuses; becomes `{"error": {...}}` with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class GenerationRequest:
    """What both endpoints share: the reply's length, the sampler overrides and the stream flags."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    messages: list[dict] = field(default_factory=list)  # chat completions
    prompt: str = ""                                      # completions
    images: dict[str, bytes] = field(default_factory=dict)  # <img>NAME</img> in messages -> the image's bytes
    audios: dict[str, bytes] = field(default_factory=dict)  # <audio>NAME</audio> in messages -> the WAV's bytes

    @property
    def media(self) -> dict[str, bytes]:
        return {**self.images, **self.audios}


def parse_chat_request(body: dict) -> GenerationRequest:
    request = _parse_common(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "expected 'messages' to be a non-empty list of {role, content} objects",
                       param="messages")
    request.messages = [_parse_message(m, f"messages[{i}]", request) for i, m in enumerate(messages)]
    return request


def parse_completion_request(body: dict) -> GenerationRequest:
    request = _parse_common(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "expected 'prompt' to be a non-empty string", param="prompt")
    request.prompt = prompt
    return request


def _parse_common(body: dict) -> GenerationRequest:
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise ApiError(400, f"only n=1 is supported, got {n!r}", param="n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise ApiError(400, "expected 'stream_options' to be an object", param="stream_options")
    return GenerationRequest(
        max_tokens=_optional_int(max_tokens, "max_tokens", low=1),
        temperature=_optional_number(body.get("temperature"), "temperature", low=0.0, high=2.0),
        top_p=_optional_number(body.get("top_p"), "top_p", low=0.0, high=1.0, low_open=True),
        seed=_optional_int(body.get("seed"), "seed", low=0),
        stop=_parse_stop(body.get("stop")),
        stream=_bool(body.get("stream", False), "stream"),
        include_usage=_bool(stream_options.get("include_usage", False), "stream_options.include_usage"),
    )


def _parse_message(message: Any, param: str, request: GenerationRequest) -> dict:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ApiError(400, "expected an object with a string 'role'", param=param)
    if message["role"] not in ROLES:
        raise ApiError(400, f"expected a role in {list(ROLES)}, got {message['role']!r}", param=f"{param}.role")
    content = message.get("content")
    if content is None:
        content = ""
    if isinstance(content, list):
        content = "".join(_content_part(part, f"{param}.content[{i}]", request) for i, part in enumerate(content))
    if not isinstance(content, str):
        raise ApiError(400, "expected 'content' to be a string or a list of text, image_url and input_audio parts",
                       param=f"{param}.content")
    return {"role": message["role"], "content": content}


def _content_part(part: Any, param: str, request: GenerationRequest) -> str:
    """A text part's text, an image_url part as <img>NAME</img> with its bytes in request.images,
    or an input_audio part as <audio>NAME</audio> with its bytes in request.audios."""
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return part["text"]
    if isinstance(part, dict) and part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if not isinstance(url, str):
            raise ApiError(400, "expected 'image_url.url' to be a string", param=f"{param}.image_url")
        data = _data_url_bytes(url, f"{param}.image_url.url")
        name = "image:" + hashlib.sha256(data).hexdigest()[:32]   # the same bytes, the same prompt text
        request.images[name] = data
        return f"<img>{name}</img>"
    if isinstance(part, dict) and part.get("type") == "input_audio":
        data = _input_audio_bytes(part.get("input_audio"), f"{param}.input_audio")
        name = "audio:" + hashlib.sha256(data).hexdigest()[:32]
        request.audios[name] = data
        return f"<audio>{name}</audio>"
    raise ApiError(400, "only text, image_url and input_audio content parts are supported", param=param)


def _input_audio_bytes(audio: Any, param: str) -> bytes:
    """The WAV bytes of an input_audio part {"data": BASE64, "format": "wav"}."""
    if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
        raise ApiError(400, "expected 'input_audio' to be an object with base64 'data' and 'format'", param=param)
    if audio.get("format") != "wav":
        raise ApiError(400, f"only 'wav' input_audio is read, got format {audio.get('format')!r}",
                       param=f"{param}.format")
    try:
        return base64.b64decode(audio["data"], validate=True)
    except binascii.Error:
        raise ApiError(400, "the input_audio data is not valid base64", param=f"{param}.data") from None


def _data_url_bytes(url: str, param: str) -> bytes:
    """The bytes of a base64 data: URL; the server fetches nothing, so any other URL is refused."""
    head, comma, payload = url.partition(",")
    if not url.startswith("data:") or not comma:
        raise ApiError(400, "only data: URLs (data:image/png;base64,...) are accepted; the server fetches nothing",
                       param=param)
    if not head.endswith(";base64"):
        raise ApiError(400, "expected a base64 data: URL (data:image/...;base64,...)", param=param)
    try:
        return base64.b64decode(payload, validate=True)
    except binascii.Error:
        raise ApiError(400, "the data: URL's payload is not valid base64", param=param) from None


def _parse_stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if (not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stop)):
        raise ApiError(400, f"expected 'stop' to be a string or a list of up to {MAX_STOP_STRINGS} "
                            "non-empty strings", param="stop")
    return tuple(stop)


def _bool(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise ApiError(400, f"expected true or false, got {value!r}", param=param)
    return value


def _optional_int(value: Any, param: str, low: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ApiError(400, f"expected an integer >= {low}, got {value!r}", param=param)
    return value


def _optional_number(value: Any, param: str, low: float, high: float, low_open: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, f"expected a number, got {value!r}", param=param)
    if not (low < value <= high if low_open else low <= value <= high):
        bracket = "(" if low_open else "["
        raise ApiError(400, f"expected a number in {bracket}{low}, {high}], got {value!r}", param=param)
    return float(value)


# ---- the sampler settings for one request ---------------------------------------------------------


def sampler_overrides(request: GenerationRequest, config: dict) -> dict:
    """Config keys that make the model's sampler honour the request.

    temperature 0 means greedy. A model configured as greedy samples when a request asks for
    a temperature or top_p, with just those two steps (MNN's greedy reads neither).
    """
    if request.temperature == 0:
        return {"sampler_type": "greedy"}
    overrides: dict[str, Any] = {}
    if request.temperature is not None:
        overrides["temperature"] = request.temperature
    if request.top_p is not None:
        overrides["top_p"] = request.top_p
    if request.seed is not None:
        overrides["seed"] = request.seed
    if overrides.keys() & {"temperature", "top_p"} and config.get("sampler_type", "mixed") == "greedy":
        steps = ["topP"] if request.top_p is not None else []
        overrides.update(sampler_type="mixed", mixed_samplers=[*steps, "temperature"])
    return overrides


# ---- responses -------------------------------------------------------------------------------------


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    def body(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


class ResponseShape:
    """The ids, object names and choice layout of one endpoint's replies and stream chunks."""

    def __init__(self, chat: bool, model: str):
        self.chat = chat
        self.model = model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def complete(self, text: str, finish_reason: str, usage: Usage) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        body = self._envelope("chat.completion" if self.chat else "text_completion", [choice])
        body["usage"] = usage.body()
        return body

    def chunk(self, text: str | None = None, finish_reason: str | None = None, first: bool = False) -> dict:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice])

    def usage_chunk(self, usage: Usage) -> dict:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = usage.body()
        return body
