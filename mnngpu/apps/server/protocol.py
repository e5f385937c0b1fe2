"""The OpenAI wire format: request bodies checked into dataclasses, errors and usage counts.

Every field a body holds is first checked against the one table of fields (fields.py): an
unknown field, or a refused one that asks for something, is a 400 naming it. The fields read
here are the implemented ones; docs/server.md lists them all.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from mnngpu.apps.server.fields import CHAT, COMPLETIONS, STREAM_OPTIONS, refused_field
from mnngpu.apps.server.structured import GrammarSpec, response_format_spec
from mnngpu.apps.server.tool_calls import ToolRequest, parse_tool_request
from mnngpu.errors import InputError

MAX_STOP_STRINGS = 4
MAX_TOP_LOGPROBS = 20
MAX_CHOICES = 128   # prompts times n in one request
# the keys each role's message may carry; a role not here, or another key, is refused by name
MESSAGE_FIELDS = {"system": ("role", "content"), "developer": ("role", "content"), "user": ("role", "content"),
                  "assistant": ("role", "content", "tool_calls"), "tool": ("role", "content", "tool_call_id")}
ROLES = tuple(MESSAGE_FIELDS)
DEFAULT_MAX_BODY_BYTES = 1 << 20
# the variables a chat template gets from the request itself; chat_template_kwargs may not set them
TEMPLATE_VARIABLES = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")

PromptInput = str | list[int]   # a prompt's text, or its token ids


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
    """What both endpoints share: the reply's length, the sampler settings, the log-probabilities
    asked for and the stream flags."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None   # None: none asked for; else how many alternatives per token (0 to 20)
    echo: bool = False            # completions: the prompt comes back first
    messages: list[dict] = field(default_factory=list)  # chat completions
    prompts: list[PromptInput] = field(default_factory=list)  # completions
    images: dict[str, bytes] = field(default_factory=dict)  # <img>NAME</img> in messages -> the image's bytes
    audios: dict[str, bytes] = field(default_factory=dict)  # <audio>NAME</audio> in messages -> the WAV's bytes
    grammar: GrammarSpec | None = None   # what every reply must follow (response_format, or a required tool call)
    tools: ToolRequest | None = None     # chat: the tools offered, and tool_choice
    template_kwargs: dict[str, Any] = field(default_factory=dict)   # chat: chat_template_kwargs
    reasoning_effort: str | None = None
    thinking_budget: int | None = None   # None: the server's --reasoning-budget; -1: no bound
    reasoning: Any = None   # chat, set with the prompt: the ReasoningPlan of a thinking model's reply, or None
    top_k: int | None = None             # Anthropic's messages: the sampler's top_k

    @property
    def media(self) -> dict[str, bytes]:
        return {**self.images, **self.audios}

    @property
    def prompt_param(self) -> str:
        return "messages" if self.messages else "prompt"


def parse_chat_request(body: dict) -> GenerationRequest:
    body = _without_nulls(body)
    request = _parse_common(body, CHAT)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "expected 'messages' to be a non-empty list of {role, content} objects",
                       param="messages")
    request.messages = [_parse_message(m, f"messages[{i}]", request) for i, m in enumerate(messages)]
    _parse_output_shape(body, request)
    _parse_thinking(body, request)
    top = _optional_int(body.get("top_logprobs"), "top_logprobs", low=0, high=MAX_TOP_LOGPROBS)
    if _bool(body.get("logprobs", False), "logprobs"):
        request.logprobs = top or 0
    elif top is not None:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return request


def _parse_output_shape(body: dict, request: GenerationRequest) -> None:
    """response_format and the tool fields: the grammar a reply follows and the calls it may hold."""
    try:
        request.grammar = response_format_spec(body.get("response_format"))
        request.tools = parse_tool_request(body.get("tools"), body.get("tool_choice"),
                                           body.get("parallel_tool_calls"))
    except InputError as exc:
        raise ApiError(400, str(exc), param=exc.field) from None
    if request.tools is not None and request.tools.in_prompt is not None:
        if request.grammar is not None:
            raise ApiError(400, "a response_format other than text cannot be combined with tools (use "
                                "tool_choice \"none\", or leave the tools out)", param="response_format")
        request.grammar = request.tools.grammar()


def _parse_thinking(body: dict, request: GenerationRequest) -> None:
    """chat_template_kwargs, reasoning_effort and thinking_budget_tokens, checked for their shape;
    what the model can do with them is checked with its template (reasoning.thinking_variables)."""
    kwargs = body.get("chat_template_kwargs", {})
    if not isinstance(kwargs, dict):
        raise ApiError(400, "expected 'chat_template_kwargs' to be an object of template variables",
                       param="chat_template_kwargs")
    reserved = next((name for name in kwargs if name in TEMPLATE_VARIABLES or name.startswith("__")), None)
    if reserved is not None:
        raise ApiError(400, f"'{reserved}' is a variable the server gives the chat template itself; "
                            "chat_template_kwargs may not set it", param=f"chat_template_kwargs.{reserved}")
    request.template_kwargs = dict(kwargs)
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise ApiError(400, f"expected one of {list(REASONING_EFFORTS)}, got {effort!r}", param="reasoning_effort")
    request.reasoning_effort = effort
    request.thinking_budget = _optional_int(body.get("thinking_budget_tokens"), "thinking_budget_tokens", low=-1)


def parse_completion_request(body: dict) -> GenerationRequest:
    body = _without_nulls(body)
    request = _parse_common(body, COMPLETIONS)
    request.prompts = _parse_prompts(body.get("prompt"))
    request.echo = _bool(body.get("echo", False), "echo")
    request.logprobs = _optional_int(body.get("logprobs"), "logprobs", low=0, high=MAX_TOP_LOGPROBS)
    if request.max_tokens == 0 and not request.echo:
        raise ApiError(400, "expected an integer >= 1, got 0 (0 only with echo)", param="max_tokens")
    if len(request.prompts) * request.n > MAX_CHOICES:
        raise ApiError(400, f"{len(request.prompts)} prompts times n={request.n} is more than {MAX_CHOICES} "
                            "choices", param="n")
    return request


def _parse_prompts(prompt: Any) -> list[PromptInput]:
    """A string, a list of strings, a list of token ids, or a list of token-id lists."""
    if isinstance(prompt, str) or is_token_ids(prompt):
        prompt = [prompt]
    if (not isinstance(prompt, list) or not prompt
            or not all(isinstance(p, str) and p or is_token_ids(p) for p in prompt)):
        raise ApiError(400, "expected 'prompt' to be a non-empty string, a list of them, a non-empty list of "
                            "token ids, or a list of those", param="prompt")
    return prompt


def is_token_ids(value: Any) -> bool:
    """Whether `value` is one prompt given as token ids: a non-empty list of integers."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(i, int) and not isinstance(i, bool) for i in value))


def _without_nulls(body: dict) -> dict:
    """A field given as null is absent, as in OpenAI's API."""
    return {name: value for name, value in body.items() if value is not None}


def _parse_common(body: dict, endpoint: str) -> GenerationRequest:
    refused = refused_field(body, endpoint)
    if refused is not None:
        raise ApiError(400, refused[1], param=refused[0], code=refused[2])
    low = 0 if endpoint == COMPLETIONS else 1
    max_tokens = _optional_int(body.get("max_tokens"), "max_tokens", low=low)
    max_completion_tokens = _optional_int(body.get("max_completion_tokens"), "max_completion_tokens", low=low)
    return GenerationRequest(
        max_tokens=max_tokens if max_completion_tokens is None else max_completion_tokens,
        temperature=_optional_number(body.get("temperature"), "temperature", low=0.0, high=2.0),
        top_p=_optional_number(body.get("top_p"), "top_p", low=0.0, high=1.0, low_open=True),
        seed=_optional_int(body.get("seed"), "seed", low=0),
        stop=_parse_stop(body.get("stop")),
        stream=_bool(body.get("stream", False), "stream"),
        include_usage=_include_usage(body.get("stream_options", {})),
        n=_optional_int(body.get("n"), "n", low=1, high=MAX_CHOICES) or 1,
        presence_penalty=_optional_number(body.get("presence_penalty"), "presence_penalty", -2.0, 2.0) or 0.0,
        frequency_penalty=_optional_number(body.get("frequency_penalty"), "frequency_penalty", -2.0, 2.0) or 0.0,
        logit_bias=_parse_logit_bias(body.get("logit_bias", {})),
    )


def _include_usage(options: Any) -> bool:
    if not isinstance(options, dict):
        raise ApiError(400, "expected 'stream_options' to be an object", param="stream_options")
    for name in options:
        if name not in STREAM_OPTIONS:
            raise ApiError(400, f"unknown field '{name}' in stream_options", param=f"stream_options.{name}")
    return _bool(options.get("include_usage", False), "stream_options.include_usage")


def _parse_logit_bias(bias: Any) -> dict[int, float]:
    """{"token id": bias from -100 to 100}; the ids are checked against the vocabulary later."""
    if not isinstance(bias, dict):
        raise ApiError(400, "expected 'logit_bias' to be an object of token id -> bias", param="logit_bias")
    parsed = {}
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise ApiError(400, f"expected token ids as keys, got {key!r}", param="logit_bias")
        parsed[int(key)] = _optional_number(value, f"logit_bias.{key}", -100.0, 100.0)
    return parsed


def _parse_message(message: Any, param: str, request: GenerationRequest) -> dict:
    """A message as the chat template gets it: role, content as text and, for an assistant's tool
    calls and a tool's reply, tool_calls and tool_call_id."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ApiError(400, "expected an object with a string 'role'", param=param)
    role = message["role"]
    if role not in ROLES:
        raise ApiError(400, f"expected a role in {list(ROLES)}, got {role!r}", param=f"{param}.role")
    read = MESSAGE_FIELDS[role]
    unread = next((name for name, value in message.items() if name not in read and value is not None), None)
    if unread is not None:
        raise ApiError(400, f"a {role} message's '{unread}' is not supported (only {', '.join(read)} are read)",
                       param=f"{param}.{unread}", code="unsupported_field")
    parsed = {"role": role, "content": _message_text(message.get("content"), param, request)}
    if role == "tool":
        parsed["tool_call_id"] = _required_str(message.get("tool_call_id"), f"{param}.tool_call_id")
    if message.get("tool_calls") is not None:
        parsed["tool_calls"] = _parse_tool_calls(message["tool_calls"], f"{param}.tool_calls")
    return parsed


def _message_text(content: Any, param: str, request: GenerationRequest) -> str:
    if content is None:
        content = ""
    if isinstance(content, list):
        content = "".join(_content_part(part, f"{param}.content[{i}]", request) for i, part in enumerate(content))
    if not isinstance(content, str):
        raise ApiError(400, "expected 'content' to be a string or a list of text, image_url and input_audio parts",
                       param=f"{param}.content")
    try:
        content.encode()
    except UnicodeEncodeError:   # a lone surrogate, as a JSON "\ud800" escape gives
        raise ApiError(400, "the text is not valid Unicode (it holds a lone surrogate)",
                       param=f"{param}.content") from None
    return content


def _parse_tool_calls(calls: Any, param: str) -> list[dict]:
    """An assistant's earlier tool calls, as HF chat templates read them: OpenAI's
    {"id", "type": "function", "function": {"name", "arguments": JSON text}}, with the arguments
    parsed into the object they write (templates render them with `tojson`)."""
    if not isinstance(calls, list):
        raise ApiError(400, "expected 'tool_calls' to be a list of function calls", param=param)
    parsed = []
    for index, call in enumerate(calls):
        where = f"{param}[{index}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function" or not isinstance(
                call.get("function"), dict):
            raise ApiError(400, 'expected {"id", "type": "function", "function": {"name", "arguments"}}',
                           param=where)
        function = call["function"]
        name = _required_str(function.get("name"), f"{where}.function.name")
        arguments = _required_str(function.get("arguments"), f"{where}.function.arguments")
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            raise ApiError(400, "expected the arguments to be a JSON object's text", param=f"{where}.function.arguments")
        parsed.append({"id": _required_str(call.get("id"), f"{where}.id"), "type": "function",
                       "function": {"name": name, "arguments": arguments}})
    return parsed


def _required_str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise ApiError(400, f"expected a string, got {value!r}", param=param)
    return value


def for_template(messages: list[dict], template: str | None) -> list[dict]:
    """The messages as the model's chat template gets them. OpenAI's `developer` role is the
    instructions role of its newer models: a template that names no developer role gets those
    messages as `system` ones, the role it has for instructions."""
    if template and "developer" in template:
        return messages
    return [{**message, "role": "system"} if message["role"] == "developer" else message for message in messages]


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


def _optional_int(value: Any, param: str, low: int, high: int | None = None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ApiError(400, f"expected an integer >= {low}, got {value!r}", param=param)
    if high is not None and value > high:
        raise ApiError(400, f"expected an integer from {low} to {high}, got {value!r}", param=param)
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
    a temperature, top_p or top_k, with just those steps (MNN's greedy reads none of them).
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
    if request.top_k is not None:
        overrides["top_k"] = request.top_k
    if overrides.keys() & {"temperature", "top_p", "top_k"} and config.get("sampler_type", "mixed") == "greedy":
        steps = ["topK"] * (request.top_k is not None) + ["topP"] * (request.top_p is not None)
        overrides.update(sampler_type="mixed", mixed_samplers=[*steps, "temperature"])
    return overrides


# ---- responses -------------------------------------------------------------------------------------


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0   # of the completion tokens, those of the think blocks (reasoning.py)

    def body(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens}}
