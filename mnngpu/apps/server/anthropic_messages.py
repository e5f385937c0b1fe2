"""Anthropic's Messages API over the chat route: POST /v1/messages and /v1/messages/count_tokens.

A body is checked against the field table (fields.py, the "messages:" rows), then translated into
the chat-completions body the chat route reads:

    system (a string or text blocks)    the first system message
    messages[i] text / image blocks     a user or assistant message's text and image_url parts
    tool_use blocks                     the assistant message's tool_calls (input -> arguments)
    tool_result blocks                  tool messages (tool_use_id -> tool_call_id)
    max_tokens, stop_sequences          max_tokens, stop
    temperature, top_p, top_k           the same sampler settings (top_k only here)
    tools {name, description, input_schema}, tool_choice auto/any/tool/none
                                        tools {type: function, function: {...}}, tool_choice
                                        auto/required/{function}/none
    output_config.format json_schema    response_format json_schema
    thinking enabled (budget_tokens)    chat_template_kwargs {enable_thinking: true}, thinking_budget_tokens
    thinking disabled                   chat_template_kwargs {enable_thinking: false}

The chat route's reply comes back as a `message` (a thinking block with a thinking model's
reasoning, text and tool_use blocks, stop_reason end_turn, max_tokens, stop_sequence or
tool_use), its stream as Anthropic's events. A refusal is
{"type": "error", "error": {"type", "message", "param"}}: Anthropic's shape, plus the field it
names as `param`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import Any

from mnngpu.apps.server.engine import Result
from mnngpu.apps.server.fields import MESSAGES
from mnngpu.apps.server.protocol import ApiError, GenerationRequest
from mnngpu.apps.server.translation import (
    CallArguments,
    CallStart,
    ChunkReader,
    Origin,
    ParamMap,
    Reasoning,
    Text,
    arguments_text,
    data_url,
    expect_dict,
    expect_list,
    expect_str,
    only_keys,
    parse_chat,
    read_reply,
    refuse_fields,
)

BLOCK_KEYS = {"text": ("type", "text", "cache_control", "citations"),
              "image": ("type", "source", "cache_control"),
              "tool_use": ("type", "id", "name", "input", "cache_control", "caller"),
              "tool_result": ("type", "tool_use_id", "content", "is_error", "cache_control"),
              "thinking": ("type", "thinking", "signature"),
              "redacted_thinking": ("type", "data")}
TOOL_KEYS = ("name", "description", "input_schema", "type", "cache_control", "strict")
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "stop": "end_turn", "cancelled": "end_turn"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
               429: "rate_limit_error", 503: "overloaded_error"}


def error_body(exc: ApiError) -> dict:
    kind = ERROR_TYPES.get(exc.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message, "param": exc.param}}


def parse(body: dict, model: str, count_only: bool = False) -> tuple[GenerationRequest, MessagesReply]:
    """The chat request a Messages body asks for, and the shape its reply takes. `count_only`: a
    count_tokens body, which has no max_tokens."""
    body = {name: value for name, value in body.items() if value is not None}
    refuse_fields(body, MESSAGES)
    params = ParamMap({"stop": "stop_sequences", "response_format": "output_config.format",
                       "tool_choice": "tool_choice", "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
                       "chat_template_kwargs": "thinking", "thinking_budget_tokens": "thinking.budget_tokens",
                       "reasoning_effort": "thinking"})
    chat: dict[str, Any] = {"messages": _messages(body, params)}
    if not count_only or "max_tokens" in body:
        chat["max_tokens"] = _max_tokens(body.get("max_tokens"))
    chat.update(_sampling(body))
    chat.update(_tools(body.get("tools"), body.get("tool_choice")))
    response_format = _output_format(body.get("output_config"))
    if response_format is not None:
        chat["response_format"] = response_format
    chat.update(_thinking(body.get("thinking")))
    if body.get("stream") is not None:
        chat["stream"] = body["stream"]
        chat["stream_options"] = {"include_usage": True}
    request = parse_chat(chat, params)
    request.top_k = _top_k(body.get("top_k"))
    return request, MessagesReply(model, params)


def _thinking(thinking: Any) -> dict:
    """The chat fields of Anthropic's thinking switch: the template's enable_thinking, and the budget."""
    if thinking is None:
        return {}
    thinking = expect_dict(thinking, "thinking", '{"type": "enabled", "budget_tokens": N} or {"type": "disabled"}')
    kind = thinking.get("type")
    keys = {"enabled": ("type", "budget_tokens", "display"), "disabled": ("type",), "adaptive": ("type", "display")}
    if kind not in keys:
        raise ApiError(400, f"expected a thinking type of enabled, disabled or adaptive, got {kind!r}",
                       param="thinking.type")
    only_keys(thinking, keys[kind], "thinking")
    if kind == "adaptive":
        return {}   # the template's own default
    if kind == "disabled":
        return {"chat_template_kwargs": {"enable_thinking": False}}
    budget = thinking.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ApiError(400, f"expected an integer >= 0, got {budget!r}", param="thinking.budget_tokens")
    return {"chat_template_kwargs": {"enable_thinking": True}, "thinking_budget_tokens": budget}


def _max_tokens(value: Any) -> int:
    if value is None:
        raise ApiError(400, "max_tokens is required", param="max_tokens")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(400, f"expected an integer >= 1, got {value!r}", param="max_tokens")
    return value


def _sampling(body: dict) -> dict:
    chat = {}
    temperature = body.get("temperature")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 1:
            raise ApiError(400, f"expected a number from 0 to 1, got {temperature!r}", param="temperature")
        chat["temperature"] = temperature
    if body.get("top_p") is not None:
        chat["top_p"] = body["top_p"]
    stops = body.get("stop_sequences")
    if stops is not None:
        chat["stop"] = expect_list(stops, "stop_sequences", "a list of strings")
    return chat


def _top_k(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ApiError(400, f"expected an integer >= 1, got {value!r}", param="top_k")
    return value


# ---- messages --------------------------------------------------------------------------------------


def _messages(body: dict, params: ParamMap) -> list[dict]:
    chat: list[dict] = []
    if body.get("system") is not None:
        chat.append({"role": "system", "content": _system_text(body["system"], "system")})
        params.messages.append(Origin("system"))
    turns = expect_list(body.get("messages"), "messages", "a non-empty list of {role, content} objects",
                        empty=False)
    for index, turn in enumerate(turns):
        where = f"messages[{index}]"
        turn = expect_dict(turn, where, "an object with 'role' and 'content'")
        only_keys(turn, ("role", "content"), where)
        role = turn.get("role")
        if role not in ("user", "assistant", "system"):
            raise ApiError(400, f"expected role 'user', 'assistant' or 'system', got {role!r}", param=f"{where}.role")
        content = turn.get("content")
        if role == "system":
            chat.append({"role": "system", "content": _system_text(content, f"{where}.content")})
            params.messages.append(Origin(where))
        elif isinstance(content, str):
            chat.append({"role": role, "content": content})
            params.messages.append(Origin(where))
        else:
            blocks = expect_list(content, f"{where}.content", "a string or a list of content blocks")
            _add_blocks(chat, params, role, blocks, f"{where}.content")
    if turns[-1].get("role") == "assistant":
        raise ApiError(400, "a last assistant turn (a prefill for the reply to continue) is not supported: the "
                            "chat template closes every turn it renders; end with a user turn",
                       param=f"messages[{len(turns) - 1}]")
    return chat


def _system_text(system: Any, param: str) -> str:
    if isinstance(system, str):
        return system
    blocks = expect_list(system, param, "a string or a list of text blocks")
    texts = []
    for index, block in enumerate(blocks):
        texts.append(_text_block(block, f"{param}[{index}]"))
    return "\n".join(texts)


def _text_block(block: Any, param: str) -> str:
    block = expect_dict(block, param, "a text block {\"type\": \"text\", \"text\": ...}")
    if block.get("type") != "text":
        raise ApiError(400, f"expected a text block, got type {block.get('type')!r}", param=f"{param}.type")
    only_keys(block, BLOCK_KEYS["text"], param)
    return expect_str(block.get("text"), f"{param}.text")


def _block_type(block: Any, param: str) -> str:
    block = expect_dict(block, param, "a content block object with a 'type'")
    kind = block.get("type")
    if kind not in BLOCK_KEYS:
        raise ApiError(400, f"expected a block of type {', '.join(BLOCK_KEYS)}, got {kind!r}", param=f"{param}.type")
    only_keys(block, BLOCK_KEYS[kind], param)
    return kind


def _add_blocks(chat: list[dict], params: ParamMap, role: str, blocks: list, param: str) -> None:
    """A turn's blocks as chat messages: tool results each a tool message, the rest one message of
    `role` (its tool_use blocks as tool_calls)."""
    parts, part_origins, calls = [], [], []
    for index, block in enumerate(blocks):
        where = f"{param}[{index}]"
        kind = _block_type(block, where)
        if kind == "text":
            parts.append({"type": "text", "text": expect_str(block.get("text"), f"{where}.text")})
            part_origins.append(where)
        elif kind == "image":
            url = _image_url(block.get("source"), f"{where}.source")
            parts.append({"type": "image_url", "image_url": {"url": url}})
            part_origins.append(f"{where}.source")
        elif kind in ("thinking", "redacted_thinking"):
            continue   # an earlier turn's thinking: the chat templates leave it out of the prompt
        elif role != ("assistant" if kind == "tool_use" else "user"):
            raise ApiError(400, f"a {kind} block belongs in a{'n assistant' if kind == 'tool_use' else ' user'} "
                                "message", param=f"{where}.type")
        elif kind == "tool_use":
            calls.append(_tool_use(block, where))
        else:
            chat.append(_tool_result(block, where, params))
    if parts or calls or not blocks:
        message: dict[str, Any] = {"role": role, "content": parts}
        if calls:
            message["tool_calls"] = calls
        chat.append(message)
        params.messages.append(Origin(param.removesuffix(".content"), part_origins))


def _image_url(source: Any, param: str) -> str:
    source = expect_dict(source, param, "an image source {\"type\": \"base64\", \"media_type\", \"data\"}")
    if source.get("type") == "base64":
        only_keys(source, ("type", "media_type", "data"), param)
        return data_url(source, param)
    if source.get("type") == "url":
        only_keys(source, ("type", "url"), param)
        url = expect_str(source.get("url"), f"{param}.url")
        if not url.startswith("data:"):
            raise ApiError(400, "only data: URLs are accepted as an image url; the server fetches nothing (send "
                                "the image as a base64 source)", param=f"{param}.url")
        return url
    raise ApiError(400, f"expected an image source of type base64 or url, got {source.get('type')!r}",
                   param=f"{param}.type")


def _tool_use(block: dict, param: str) -> dict:
    name = expect_str(block.get("name"), f"{param}.name")
    arguments = arguments_text(expect_dict(block.get("input"), f"{param}.input", "the tool's input as an object"),
                               f"{param}.input")
    return {"id": expect_str(block.get("id"), f"{param}.id"), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _tool_result(block: dict, param: str, params: ParamMap) -> dict:
    """A tool message; its content a string, or text and image blocks."""
    tool_use_id = expect_str(block.get("tool_use_id"), f"{param}.tool_use_id")
    if not isinstance(block.get("is_error", False), bool):
        raise ApiError(400, "expected true or false", param=f"{param}.is_error")
    content = block.get("content", "")
    origins = []
    if not isinstance(content, str):
        parts = []
        for index, inner in enumerate(expect_list(content, f"{param}.content", "a string or a list of blocks")):
            where = f"{param}.content[{index}]"
            kind = _block_type(inner, where)
            if kind == "text":
                parts.append({"type": "text", "text": expect_str(inner.get("text"), f"{where}.text")})
                origins.append(where)
            elif kind == "image":
                parts.append({"type": "image_url", "image_url": {"url": _image_url(inner.get("source"),
                                                                                   f"{where}.source")}})
                origins.append(f"{where}.source")
            else:
                raise ApiError(400, "a tool_result holds text and image blocks only", param=f"{where}.type")
        content = parts
    params.messages.append(Origin(param, origins))
    return {"role": "tool", "tool_call_id": tool_use_id, "content": content}


# ---- tools and the output format --------------------------------------------------------------------


def _tools(tools: Any, choice: Any) -> dict:
    chat: dict[str, Any] = {}
    if tools is not None:
        chat["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in
                         enumerate(expect_list(tools, "tools", "a list of tools {name, description, input_schema}"))]
    if choice is None:
        return chat
    choice = expect_dict(choice, "tool_choice", "an object {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}")
    kind = choice.get("type")
    keys = {"auto": ("type", "disable_parallel_tool_use"), "any": ("type", "disable_parallel_tool_use"),
            "tool": ("type", "name", "disable_parallel_tool_use"), "none": ("type",)}
    if kind not in keys:
        raise ApiError(400, f"expected a tool_choice type of auto, any, tool or none, got {kind!r}",
                       param="tool_choice.type")
    only_keys(choice, keys[kind], "tool_choice")
    if kind == "none" and not chat.get("tools"):
        return chat   # no tools, and none to use: as Anthropic's API, nothing to say
    if kind == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": expect_str(choice.get("name"),
                                                                                   "tool_choice.name")}}
    else:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    single = choice.get("disable_parallel_tool_use")
    if single is not None:
        if not isinstance(single, bool):
            raise ApiError(400, "expected true or false", param="tool_choice.disable_parallel_tool_use")
        chat["parallel_tool_calls"] = not single
    return chat


def _tool(tool: Any, param: str) -> dict:
    tool = expect_dict(tool, param, "a tool {name, description, input_schema}")
    if tool.get("type", "custom") not in ("custom", None):
        raise ApiError(400, f"only custom tools {{name, description, input_schema}} are supported, not "
                            f"{tool.get('type')!r}", param=f"{param}.type")
    only_keys(tool, TOOL_KEYS, param)
    function = {"name": tool.get("name"), "parameters": expect_dict(tool.get("input_schema"), f"{param}.input_schema",
                                                                    "the tool's input_schema as a JSON schema object")}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _output_format(config: Any) -> dict | None:
    if config is None:
        return None
    config = expect_dict(config, "output_config", "an object with 'format'")
    only_keys(config, ("effort", "format"), "output_config")
    if config.get("effort") is not None:
        raise ApiError(400, "'output_config.effort' is not supported: the chat template decides how the model "
                            "reasons", param="output_config.effort", code="unsupported_field")
    form = config.get("format")
    if form is None:
        return None
    form = expect_dict(form, "output_config.format", "{\"type\": \"json_schema\", \"schema\": {...}}")
    only_keys(form, ("type", "schema"), "output_config.format")
    if form.get("type") != "json_schema":
        raise ApiError(400, f"expected the format type json_schema, got {form.get('type')!r}",
                       param="output_config.format.type")
    schema = expect_dict(form.get("schema"), "output_config.format.schema", "the JSON schema as an object")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


# ---- the reply ---------------------------------------------------------------------------------------


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _call_input(arguments: str) -> dict:
    """A call's input; a call cut off before its arguments were whole (max_tokens) keeps their text."""
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"_unparsed_arguments": arguments}


def stop_reason(finish: str, stop_string: str | None) -> str:
    return "stop_sequence" if stop_string is not None else STOP_REASONS.get(finish, "end_turn")


class MessagesReply:
    """The chat route's reply as Anthropic's `message`, and its stream as Anthropic's events."""

    def __init__(self, model: str, params: ParamMap):
        self.model, self.params = model, params   # params: what an error names, in this API's words
        self.id = "msg_" + uuid.uuid4().hex
        self.input_tokens = 0   # the prompt's tokens, for message_start (set before a stream starts)

    def _message(self, content: list[dict], usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": None, "stop_sequence": None, "usage": usage}

    def body(self, completion: dict, result: Result) -> dict:
        reply = read_reply(completion, result)
        content = [] if reply.reasoning is None else [{"type": "thinking", "thinking": reply.reasoning,
                                                       "signature": ""}]
        if reply.answered and (reply.text or not reply.calls):
            content.append({"type": "text", "text": reply.text})
        content += [{"type": "tool_use", "id": _tool_use_id(call.id), "name": call.name,
                     "input": _call_input(call.arguments)} for call in reply.calls]
        message = self._message(content, _usage(reply.prompt_tokens, reply.cached_tokens, reply.completion_tokens))
        message["stop_reason"] = stop_reason(reply.finish_reason, reply.stop_string)
        message["stop_sequence"] = reply.stop_string
        return message

    async def events(self, chunks: AsyncIterator[dict], future: Future) -> AsyncIterator[str]:
        yield _event("message_start", {"message": self._message([], _usage(self.input_tokens, 0, 0))})
        blocks = _Blocks()
        reader = ChunkReader()
        async for chunk in chunks:
            for event in reader.read(chunk):
                for name, payload in blocks.take(event):
                    yield _event(name, payload)
        if reader.error is not None:
            error = reader.error["error"]
            yield _event("error", {"error": {"type": "api_error" if error.get("type") == "server_error"
                                             else error.get("type"), "message": error.get("message")}})
            return
        for name, payload in blocks.close(final=True):
            yield _event(name, payload)
        result: Result = future.result()
        choice, usage = result.choices[0], result.usage
        finish = "tool_calls" if reader.finish_reason == "tool_calls" else choice.finish_reason
        yield _event("message_delta", {
            "delta": {"stop_reason": stop_reason(finish, choice.stop_string), "stop_sequence": choice.stop_string},
            "usage": _usage(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)})
        yield _event("message_stop", {})


def _usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict:
    """Anthropic counts the prompt's tokens read from the cache apart from the others."""
    return {"input_tokens": prompt_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached_tokens}


class _Blocks:
    """The content blocks a stream opens and closes: thinking, text, then a tool_use block per call
    (text after a call opens a new text block)."""

    def __init__(self):
        self.count = 0
        self.open: str | None = None   # "text", or "call <index>"

    def take(self, event: Reasoning | Text | CallStart | CallArguments) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        if isinstance(event, Reasoning):
            if self.open != "thinking":
                out += self.close()
                out.append(self._start({"type": "thinking", "thinking": "", "signature": ""}, "thinking"))
            out.append(("content_block_delta", {"index": self.count - 1,
                                                "delta": {"type": "thinking_delta", "thinking": event.text}}))
        elif isinstance(event, Text):
            if self.open != "text":
                out += self.close()
                out.append(self._start({"type": "text", "text": ""}, "text"))
            out.append(("content_block_delta", {"index": self.count - 1,
                                                "delta": {"type": "text_delta", "text": event.text}}))
        elif isinstance(event, CallStart):
            out += self.close()
            out.append(self._start({"type": "tool_use", "id": _tool_use_id(event.id), "name": event.name,
                                    "input": {}}, f"call {event.index}"))
        else:
            out.append(("content_block_delta", {"index": self.count - 1,
                                                "delta": {"type": "input_json_delta",
                                                          "partial_json": event.arguments}}))
        return out

    def _start(self, block: dict, kind: str) -> tuple[str, dict]:
        self.count += 1
        self.open = kind
        return "content_block_start", {"index": self.count - 1, "content_block": block}

    def close(self, final: bool = False) -> list[tuple[str, dict]]:
        out = []
        if final and self.count == 0:   # an empty reply: one empty text block, as the whole reply has
            out.append(self._start({"type": "text", "text": ""}, "text"))
        if self.open is not None:
            out.append(("content_block_stop", {"index": self.count - 1}))
            self.open = None
        return out


def _event(name: str, payload: dict) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **payload}, ensure_ascii=False)}\n\n"
