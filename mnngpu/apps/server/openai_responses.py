"""OpenAI's Responses API over the chat route: POST /v1/responses and GET /v1/responses/{id}.

A body is checked against the field table (fields.py, the "responses:" rows), then translated into
the chat-completions body the chat route reads:

    instructions                        a system message first (a later response does not inherit it)
    previous_response_id                the stored conversation it continues: its messages next
    input (a string, or items)          messages (input_text, input_image, output_text parts),
                                        function_call items as an assistant's tool_calls,
                                        function_call_output items as tool messages
    max_output_tokens, temperature, top_p, tools (function), tool_choice, parallel_tool_calls
                                        the chat fields of the same meaning
    text.format                         response_format (text, json_object, json_schema)
    reasoning.effort                    reasoning_effort

The chat route's reply comes back as a `response` whose output holds a reasoning item (a thinking
model's reasoning, as reasoning_text), a message item and a function_call item per call, its
stream as the Responses events, each with its sequence_number.
A response with `store` (the default) is kept in memory, the last MAX_STORED of them (least
recently used go first), so that previous_response_id can continue it and GET can read it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from mnngpu.apps.server.engine import Result
from mnngpu.apps.server.fields import RESPONSES
from mnngpu.apps.server.protocol import ApiError, GenerationRequest
from mnngpu.apps.server.translation import (
    Call,
    CallArguments,
    CallStart,
    ChunkReader,
    Origin,
    ParamMap,
    Reasoning,
    Text,
    arguments_text,
    expect_dict,
    expect_list,
    expect_str,
    only_keys,
    parse_chat,
    read_reply,
    refuse_fields,
)

MAX_STORED = 256   # responses kept for previous_response_id; the least recently used are dropped first
ROLES = ("user", "system", "developer", "assistant")
PART_KEYS = {"input_text": ("type", "text"), "output_text": ("type", "text", "annotations", "logprobs"),
             "refusal": ("type", "refusal"), "input_image": ("type", "image_url", "detail", "file_id")}
ITEM_KEYS = {"message": ("type", "role", "content", "id", "status"),
             "function_call": ("type", "id", "call_id", "name", "arguments", "status"),
             "function_call_output": ("type", "id", "call_id", "output", "status"),
             "reasoning": ("type", "id", "summary", "content", "encrypted_content", "status")}
FORMAT_KEYS = {"text": ("type",), "json_object": ("type",),
               "json_schema": ("type", "name", "schema", "strict", "description")}


@dataclass
class Stored:
    body: dict            # the response, as GET returns it
    history: list[dict]   # its conversation as chat messages (instructions left out), its output last


class ResponseStore:
    """The stored responses, in memory for the server's lifetime, at most `size` of them."""

    def __init__(self, size: int = MAX_STORED):
        self.size = size
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, stored: Stored) -> None:
        with self._lock:
            self._items[response_id] = stored
            self._items.move_to_end(response_id)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> Stored | None:
        with self._lock:
            stored = self._items.get(response_id)
            if stored is not None:
                self._items.move_to_end(response_id)
            return stored

    def find(self, response_id: str) -> dict:
        """GET /v1/responses/{id}: the stored response, or a 404 naming the id."""
        stored = self.get(response_id)
        if stored is None:
            raise ApiError(404, f"no stored response with id '{response_id}' (the server keeps the last "
                                f"{self.size} responses with store: true)", param="response_id",
                           kind="not_found_error", code="response_not_found")
        return stored.body


def parse(body: dict, model: str, store: ResponseStore) -> tuple[GenerationRequest, ResponsesReply]:
    """The chat request a Responses body asks for, and the shape its reply takes."""
    body = {name: value for name, value in body.items() if value is not None}
    refuse_fields(body, RESPONSES)
    params = ParamMap({"max_tokens": "max_output_tokens", "response_format": "text.format",
                       "reasoning_effort": "reasoning.effort", "messages": "input"})
    history = _previous(body.get("previous_response_id"), store)
    params.messages += [Origin("previous_response_id") for _ in history]
    messages = history + _input(body.get("input"), params)
    chat: dict[str, Any] = {"messages": messages}
    if body.get("instructions") is not None:
        chat["messages"] = [{"role": "system", "content": expect_str(body["instructions"], "instructions")},
                            *messages]
        params.messages.insert(0, Origin("instructions"))
    for own, name in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                      ("parallel_tool_calls", "parallel_tool_calls")):
        if own in body:
            chat[name] = body[own]
    chat.update(_tools(body.get("tools"), body.get("tool_choice")))
    text = _text(body.get("text"))
    if text is not None:
        chat["response_format"] = text
    chat.update(_reasoning(body.get("reasoning")))
    _check_stream_options(body.get("stream_options"))
    if body.get("stream") is not None:
        chat["stream"] = body["stream"]
        chat["stream_options"] = {"include_usage": True}
    store_it = body.get("store", True)
    if not isinstance(store_it, bool):
        raise ApiError(400, f"expected true or false, got {store_it!r}", param="store")
    request = parse_chat(chat, params)
    echo = {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata", {}), "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"), "store": store_it,
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "text": {"format": body.get("text", {}).get("format") or {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", []),
            "reasoning": {"effort": body.get("reasoning", {}).get("effort"),
                          "summary": body.get("reasoning", {}).get("summary")}}
    return request, ResponsesReply(model, echo, store if store_it else None, messages, params)


def _reasoning(reasoning: Any) -> dict:
    if reasoning is None:
        return {}
    reasoning = expect_dict(reasoning, "reasoning", "an object with 'effort'")
    only_keys(reasoning, ("effort", "summary", "generate_summary"), "reasoning")
    return {} if reasoning.get("effort") is None else {"reasoning_effort": reasoning["effort"]}


def _previous(response_id: Any, store: ResponseStore) -> list[dict]:
    if response_id is None:
        return []
    stored = store.get(expect_str(response_id, "previous_response_id"))
    if stored is None:
        raise ApiError(400, f"no stored response with id '{response_id}' (the server keeps the last {store.size} "
                            "responses with store: true)", param="previous_response_id",
                       code="previous_response_not_found")
    return list(stored.history)


def _check_stream_options(options: Any) -> None:
    if options is None:
        return
    options = expect_dict(options, "stream_options", "an object")
    only_keys(options, ("include_obfuscation",), "stream_options")
    if not isinstance(options.get("include_obfuscation", False), bool):
        raise ApiError(400, "expected true or false", param="stream_options.include_obfuscation")


# ---- input -------------------------------------------------------------------------------------------


def _input(value: Any, params: ParamMap) -> list[dict]:
    if isinstance(value, str):
        params.messages.append(Origin("input"))
        return [{"role": "user", "content": value}]
    items = expect_list(value, "input", "a string or a non-empty list of input items", empty=False)
    chat: list[dict] = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        item = expect_dict(item, where, "an input item object")
        kind = item.get("type", "message")
        if kind not in ITEM_KEYS:
            raise ApiError(400, f"expected an item of type {', '.join(ITEM_KEYS)}, got {kind!r}",
                           param=f"{where}.type")
        only_keys(item, ITEM_KEYS[kind], where)
        if kind == "message":
            chat.append(_message(item, where, params))
        elif kind == "function_call":
            _add_call(chat, params, item, where)
        elif kind == "function_call_output":
            chat.append(_call_output(item, where, params))
    return chat


def _message(item: dict, param: str, params: ParamMap) -> dict:
    role = item.get("role")
    if role not in ROLES:
        raise ApiError(400, f"expected a role in {list(ROLES)}, got {role!r}", param=f"{param}.role")
    content = item.get("content")
    if isinstance(content, str):
        params.messages.append(Origin(param))
        return {"role": role, "content": content}
    parts, origins = _parts(expect_list(content, f"{param}.content", "a string or a list of content parts"),
                            f"{param}.content")
    params.messages.append(Origin(param, origins))
    return {"role": role, "content": parts}


def _parts(parts: list, param: str) -> tuple[list[dict], list[str]]:
    chat, origins = [], []
    for index, part in enumerate(parts):
        where = f"{param}[{index}]"
        part = expect_dict(part, where, "a content part object")
        kind = part.get("type")
        if kind not in PART_KEYS:
            raise ApiError(400, f"expected a part of type {', '.join(PART_KEYS)}, got {kind!r}",
                           param=f"{where}.type")
        only_keys(part, PART_KEYS[kind], where)
        if kind == "input_image":
            if part.get("file_id") is not None:
                raise ApiError(400, "file ids are not supported: send the image as a data: URL in image_url",
                               param=f"{where}.file_id")
            chat.append({"type": "image_url", "image_url": {"url": expect_str(part.get("image_url"),
                                                                              f"{where}.image_url")}})
            origins.append(f"{where}.image_url")
        else:
            text_key = "refusal" if kind == "refusal" else "text"
            chat.append({"type": "text", "text": expect_str(part.get(text_key), f"{where}.{text_key}")})
            origins.append(where)
    return chat, origins


def _add_call(chat: list[dict], params: ParamMap, item: dict, param: str) -> None:
    """A function_call item joins the assistant message just before it, or starts one."""
    call = {"id": expect_str(item.get("call_id"), f"{param}.call_id"), "type": "function",
            "function": {"name": expect_str(item.get("name"), f"{param}.name"),
                         "arguments": arguments_text(item.get("arguments"), f"{param}.arguments")}}
    if chat and chat[-1]["role"] == "assistant":
        chat[-1].setdefault("tool_calls", []).append(call)
        return
    chat.append({"role": "assistant", "content": None, "tool_calls": [call]})
    params.messages.append(Origin(param))


def _call_output(item: dict, param: str, params: ParamMap) -> dict:
    call_id = expect_str(item.get("call_id"), f"{param}.call_id")
    output = item.get("output")
    if isinstance(output, str):
        params.messages.append(Origin(param))
        return {"role": "tool", "tool_call_id": call_id, "content": output}
    parts, origins = _parts(expect_list(output, f"{param}.output", "a string or a list of content parts"),
                            f"{param}.output")
    params.messages.append(Origin(param, origins))
    return {"role": "tool", "tool_call_id": call_id, "content": parts}


# ---- tools and the text format ----------------------------------------------------------------------


def _tools(tools: Any, choice: Any) -> dict:
    chat: dict[str, Any] = {}
    if tools is not None:
        chat["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in
                         enumerate(expect_list(tools, "tools", "a list of function tools"))]
    if choice is None:
        return chat
    if isinstance(choice, dict) and choice.get("type") == "function":
        only_keys(choice, ("type", "name"), "tool_choice")
        chat["tool_choice"] = {"type": "function", "function": {"name": expect_str(choice.get("name"),
                                                                                   "tool_choice.name")}}
    elif isinstance(choice, dict):
        raise ApiError(400, f"only function tool choices are supported, not {choice.get('type')!r}",
                       param="tool_choice.type")
    else:
        chat["tool_choice"] = choice   # none, auto or required: the chat route checks it
    return chat


def _tool(tool: Any, param: str) -> dict:
    tool = expect_dict(tool, param, "a function tool {type: function, name, parameters}")
    if tool.get("type") != "function":
        raise ApiError(400, f"only function tools are supported, not {tool.get('type')!r}", param=f"{param}.type")
    only_keys(tool, ("type", "name", "description", "parameters", "strict"), param)
    function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if tool.get(key) is not None}
    return {"type": "function", "function": function}


def _text(text: Any) -> dict | None:
    if text is None:
        return None
    text = expect_dict(text, "text", "an object with 'format'")
    only_keys(text, ("format", "verbosity"), "text")
    if text.get("verbosity") is not None:
        raise ApiError(400, "'text.verbosity' is not supported: the model writes as it writes",
                       param="text.verbosity", code="unsupported_field")
    form = text.get("format")
    if form is None:
        return None
    form = expect_dict(form, "text.format", "an object with a 'type'")
    kind = form.get("type")
    if kind not in FORMAT_KEYS:
        raise ApiError(400, f"expected a format type in {list(FORMAT_KEYS)}, got {kind!r}", param="text.format.type")
    only_keys(form, FORMAT_KEYS[kind], "text.format")
    if kind != "json_schema":
        return {"type": kind}
    return {"type": "json_schema", "json_schema": {key: form[key] for key in FORMAT_KEYS[kind][1:] if key in form}}


# ---- the reply ---------------------------------------------------------------------------------------


def _status(finish: str) -> tuple[str, dict | None]:
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return ("cancelled" if finish == "cancelled" else "completed"), None


def _message_item(item_id: str, text: str | None, status: str) -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [] if text is None else [_text_part(text)]}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(item_id: str, call: Call, status: str) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}


def _reasoning_item(item_id: str, text: str | None, status: str) -> dict:
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
            "content": [] if text is None else [{"type": "reasoning_text", "text": text}]}


def _usage(prompt: int, cached: int, output: int, reasoning: int = 0) -> dict:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": prompt + output}


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


class ResponsesReply:
    """The chat route's reply as a `response`, and its stream as the Responses events; a reply to
    store is stored once it is whole."""

    def __init__(self, model: str, echo: dict, store: ResponseStore | None, history: list[dict], params: ParamMap):
        self.model, self.echo, self.store, self.history = model, echo, store, history
        self.params = params   # what an error names, in this API's words
        self.id = _new_id("resp_")
        self.created = int(time.time())

    def _response(self, status: str, output: list[dict], usage: dict | None, incomplete: dict | None = None) -> dict:
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "background": False, "error": None, "incomplete_details": incomplete, "model": self.model,
                "output": output, "usage": usage, "truncation": "disabled", "user": None, "max_tool_calls": None,
                **self.echo}

    def body(self, completion: dict, result: Result) -> dict:
        reply = read_reply(completion, result)
        status, incomplete = _status(reply.finish_reason)
        item_status = "incomplete" if status == "incomplete" else "completed"
        output = [] if reply.reasoning is None else [_reasoning_item(_new_id("rs_"), reply.reasoning, item_status)]
        if reply.answered and (reply.text or not reply.calls):
            output.append(_message_item(_new_id("msg_"), reply.text, item_status))
        output += [_call_item(_new_id("fc_"), call, "completed") for call in reply.calls]
        usage = _usage(reply.prompt_tokens, reply.cached_tokens, reply.completion_tokens, reply.reasoning_tokens)
        return self._finished(self._response(status, output, usage, incomplete), reply.text, reply.calls)

    def _finished(self, response: dict, text: str, calls: list[Call]) -> dict:
        if self.store is not None:
            self.store.put(self.id, Stored(response, [*self.history, _assistant_message(text, calls)]))
        return response

    async def events(self, chunks: AsyncIterator[dict], future: Future) -> AsyncIterator[str]:
        stream = _Items()
        yield stream.event("response.created", response=self._response("in_progress", [], None))
        yield stream.event("response.in_progress", response=self._response("in_progress", [], None))
        reader = ChunkReader()
        async for chunk in chunks:
            for event in reader.read(chunk):
                for text in stream.take(event):
                    yield text
        if reader.error is not None:
            error = reader.error["error"]
            yield stream.event("error", code=error.get("code"), message=error.get("message"),
                               param=self.params.own(error.get("param")))
            return
        result: Result = future.result()
        status, incomplete = _status(result.choices[0].finish_reason)
        for text in stream.close(final=True, status="incomplete" if status == "incomplete" else "completed"):
            yield text
        usage = result.usage
        response = self._response(status, stream.output, _usage(usage.prompt_tokens, usage.cached_tokens,
                                                                usage.completion_tokens,
                                                                getattr(usage, "reasoning_tokens", 0)), incomplete)
        self._finished(response, stream.text, stream.calls)
        yield stream.event("response.completed" if status != "incomplete" else "response.incomplete",
                           response=response)


def _assistant_message(text: str, calls: list[Call]) -> dict:
    """The reply as the chat route reads an assistant's turn; a call cut off before its arguments
    were whole is left out (the chat route reads whole calls only)."""
    whole = [call for call in calls if _is_object_text(call.arguments)]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if whole:
        message["tool_calls"] = [{"id": call.id, "type": "function",
                                  "function": {"name": call.name, "arguments": call.arguments}} for call in whole]
    return message


def _is_object_text(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


class _Items:
    """The output items a stream opens and closes, and the events that say so, numbered."""

    def __init__(self):
        self.sequence = 0
        self.output: list[dict] = []   # the items closed so far
        self.text = ""                 # all the reply's text
        self.calls: list[Call] = []
        self.open: dict | None = None  # the item being written

    def event(self, kind: str, **payload: Any) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def take(self, event: Reasoning | Text | CallStart | CallArguments) -> list[str]:
        out: list[str] = []
        if isinstance(event, Reasoning):
            if self.open is None or self.open["type"] != "reasoning":
                out += self.close()
                self.open = _reasoning_item(_new_id("rs_"), None, "in_progress")
                out.append(self.event("response.output_item.added", output_index=len(self.output),
                                      item={**self.open, "content": []}))
                self.open["content"].append({"type": "reasoning_text", "text": ""})
            self.open["content"][0]["text"] += event.text
            out.append(self.event("response.reasoning_text.delta", item_id=self.open["id"],
                                  output_index=len(self.output), content_index=0, delta=event.text))
        elif isinstance(event, Text):
            if self.open is None or self.open["type"] != "message":
                out += self.close()
                out += self._open_message()
            self.open["content"][0]["text"] += event.text
            self.text += event.text
            out.append(self.event("response.output_text.delta", item_id=self.open["id"],
                                  output_index=len(self.output), content_index=0, delta=event.text, logprobs=[]))
        elif isinstance(event, CallStart):
            out += self.close()
            self.calls.append(Call(event.id, event.name, ""))
            self.open = _call_item(_new_id("fc_"), self.calls[-1], "in_progress")
            out.append(self.event("response.output_item.added", output_index=len(self.output), item=self.open))
        else:
            self.open["arguments"] += event.arguments
            self.calls[-1].arguments += event.arguments
            out.append(self.event("response.function_call_arguments.delta", item_id=self.open["id"],
                                  output_index=len(self.output), delta=event.arguments))
        return out

    def _open_message(self) -> list[str]:
        self.open = _message_item(_new_id("msg_"), None, "in_progress")
        added = self.event("response.output_item.added", output_index=len(self.output),
                           item={**self.open, "content": []})
        self.open["content"].append(_text_part(""))
        return [added, self.event("response.content_part.added", item_id=self.open["id"],
                                  output_index=len(self.output), content_index=0, part=_text_part(""))]

    def close(self, final: bool = False, status: str = "completed") -> list[str]:
        out: list[str] = []
        if final and not self.output and self.open is None:   # an empty reply: one empty message
            out += self._open_message()
        item, index = self.open, len(self.output)
        if item is None:
            return out
        item["status"] = status if final else "completed"
        if item["type"] == "reasoning":
            out.append(self.event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                  content_index=0, text=item["content"][0]["text"]))
        elif item["type"] == "message":
            part = item["content"][0]
            out.append(self.event("response.output_text.done", item_id=item["id"], output_index=index,
                                  content_index=0, text=part["text"], logprobs=[]))
            out.append(self.event("response.content_part.done", item_id=item["id"], output_index=index,
                                  content_index=0, part=part))
        else:
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                  name=item["name"], arguments=item["arguments"]))
        out.append(self.event("response.output_item.done", output_index=index, item=item))
        self.output.append(item)
        self.open = None
        return out
