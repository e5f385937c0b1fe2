"""What the Anthropic Messages and OpenAI Responses routes share: they are translations over the
chat route. A request becomes the chat-completions body the chat route reads (parse_chat_request),
so a reply's text is the chat route's for the same prompt and seed; the chat route's reply and
stream chunks are read back as the text and tool calls each API then shapes.

    ParamMap      where each part of the chat body came from, so an error the chat parser raises
                  names the request's own field (`stop` -> `stop_sequences`, `messages[2]` ->
                  `input[4]`, ...)
    parse_chat    parse_chat_request over a translated body, its errors renamed
    Reply         a whole chat reply read back: reasoning, text, tool calls, finish reason, usage
    ChunkReader   a chat stream's chunks read back as Reasoning, Text, CallStart, CallArguments
                  events

A thinking model's reasoning (reasoning.py) comes from the chat route as `reasoning_content`; each
API gives it back in its own shape (Anthropic's thinking blocks, the Responses reasoning items).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from mnngpu.apps.server.engine import Result
from mnngpu.apps.server.fields import refused_field
from mnngpu.apps.server.protocol import ApiError, GenerationRequest, parse_chat_request

CHAT_MESSAGE_PARAM = re.compile(r"messages\[(\d+)\](?:\.content\[(\d+)\])?")


@dataclass
class Origin:
    """Where one chat message came from: its own path, and the path of each of its content parts."""

    path: str
    parts: list[str] = field(default_factory=list)


@dataclass
class ParamMap:
    fields: dict[str, str] = field(default_factory=dict)   # a chat field -> the request's own field
    messages: list[Origin] = field(default_factory=list)   # one per chat message, in order

    def own(self, param: str | None) -> str | None:
        """The request's own name for the chat param `param`."""
        if param is None:
            return None
        found = CHAT_MESSAGE_PARAM.match(param)
        if found is not None and int(found.group(1)) < len(self.messages):
            origin = self.messages[int(found.group(1))]
            if found.group(2) is not None and int(found.group(2)) < len(origin.parts):
                return origin.parts[int(found.group(2))]   # the chat part's own suffix means nothing here
            return origin.path + param[found.end():]
        head = re.match(r"[a-z_]+", param)
        name = head.group(0) if head else param
        return self.fields.get(name, name) + _own_suffix(name, param[len(name):])


def _own_suffix(name: str, suffix: str) -> str:
    """The rest of a chat path as both APIs write it: a tool's `[0].function.parameters` is
    `[0].parameters`, a format's `.json_schema.schema` is `.schema`."""
    if name in ("tools", "tool_choice"):
        return suffix.replace(".function.", ".")
    return suffix.replace(".json_schema.", ".") if name == "response_format" else suffix


def refuse_fields(body: dict, endpoint: str) -> None:
    """An unknown field, or a refused one that asks for something: a 400 naming it."""
    refused = refused_field(body, endpoint)
    if refused is not None:
        raise ApiError(400, refused[1], param=refused[0], code=refused[2])


def parse_chat(chat: dict, params: ParamMap) -> GenerationRequest:
    """The chat route's parse of a translated body; an error names the request's own field."""
    try:
        return parse_chat_request(chat)
    except ApiError as exc:
        raise renamed(exc, params) from None


def renamed(exc: ApiError, params: ParamMap) -> ApiError:
    """`exc` naming the request's own field where it named a chat field."""
    own = params.own(exc.param)
    if exc.param and own != exc.param:
        exc.message = exc.message.replace(exc.param, own)
    exc.param = own
    return exc


# ---- checks of the request's own shapes ---------------------------------------------------------------


def expect_dict(value: Any, param: str, what: str) -> dict:
    if not isinstance(value, dict):
        raise ApiError(400, f"expected {what}", param=param)
    return value


def expect_list(value: Any, param: str, what: str, empty: bool = True) -> list:
    if not isinstance(value, list) or not empty and not value:
        raise ApiError(400, f"expected {what}", param=param)
    return value


def expect_str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise ApiError(400, f"expected a string, got {_short(value)}", param=param)
    return value


def only_keys(value: dict, known: tuple[str, ...], param: str) -> None:
    unknown = next((name for name in value if name not in known), None)
    if unknown is not None:
        raise ApiError(400, f"unknown key '{unknown}' (expected {', '.join(known)})", param=f"{param}.{unknown}",
                       code="unknown_field")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def data_url(source: dict, param: str) -> str:
    """A data: URL for an image given as base64 bytes and their media type."""
    media_type = expect_str(source.get("media_type"), f"{param}.media_type")
    if not re.fullmatch(r"image/[A-Za-z0-9.+-]+", media_type):
        raise ApiError(400, f"expected an image media type such as image/png, got {_short(media_type)}",
                       param=f"{param}.media_type")
    return f"data:{media_type};base64,{expect_str(source.get('data'), f'{param}.data')}"


def arguments_text(arguments: Any, param: str) -> str:
    """A call's arguments as the chat route reads them: the text of a JSON object."""
    if isinstance(arguments, dict):
        return json.dumps(arguments, ensure_ascii=False)
    text = expect_str(arguments, param)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ApiError(400, "expected the arguments to be a JSON object's text", param=param)
    return text


# ---- the chat reply, read back --------------------------------------------------------------------------


@dataclass
class Call:
    id: str
    name: str
    arguments: str


@dataclass
class Reply:
    reasoning: str | None   # a thinking model's reasoning; None: the reply has none
    answered: bool          # False: the reply was cut off inside its reasoning
    text: str
    calls: list[Call]
    finish_reason: str      # the chat route's: stop, length, tool_calls or cancelled
    stop_string: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int


def read_reply(completion: dict, result: Result) -> Reply:
    """The first choice of a chat.completion body (these APIs ask for one)."""
    choice = completion["choices"][0]
    message = choice["message"]
    calls = [Call(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    usage = result.usage
    answered = message.get("content") is not None or not message.get("reasoning_content")
    return Reply(message.get("reasoning_content"), answered, message.get("content") or "", calls,
                 choice["finish_reason"], result.choices[0].stop_string, usage.prompt_tokens,
                 usage.completion_tokens, usage.cached_tokens, getattr(usage, "reasoning_tokens", 0))


@dataclass
class Reasoning:
    text: str


@dataclass
class Text:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class CallArguments:
    index: int
    arguments: str


class ChunkReader:
    """Reads the chat stream's chunks: each gives the events it holds; `finish_reason` and `usage`
    once they come; `error` holds an error body the stream ended with."""

    def __init__(self):
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.error: dict | None = None

    def read(self, chunk: dict) -> list[Reasoning | Text | CallStart | CallArguments]:
        if "error" in chunk:
            self.error = chunk
            return []
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        events: list[Reasoning | Text | CallStart | CallArguments] = []
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            if delta.get("reasoning_content"):
                events.append(Reasoning(delta["reasoning_content"]))
            if delta.get("content"):
                events.append(Text(delta["content"]))
            for call in delta.get("tool_calls") or []:
                if call.get("id") is not None:
                    events.append(CallStart(call["index"], call["id"], call["function"]["name"]))
                if call["function"].get("arguments"):
                    events.append(CallArguments(call["index"], call["function"]["arguments"]))
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return events
