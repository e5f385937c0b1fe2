"""The one table of request fields: every field of OpenAI's chat-completions and completions
requests, and what this server does with it.

    implemented  the field does what OpenAI's API says (see its note for the limits)
    inert        accepted, and changes nothing a client can see (`user`, `metadata`, ...)
    refused      a 400 naming the field, unless its value is one that asks for nothing
                 (null, or the value the note names)

A field not in the table is refused with a 400 naming it too. A field given as null counts as
absent, as in OpenAI's API. docs/server.md shows the table (`markdown_table`); a test checks
that it covers every field of the installed `openai` package's request types.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

IMPLEMENTED, INERT, REFUSED = "implemented", "inert", "refused"
CHAT, COMPLETIONS = "chat", "completions"
BOTH = (CHAT, COMPLETIONS)


@dataclass(frozen=True)
class Field:
    endpoints: tuple[str, ...]
    status: str
    note: str
    asks_nothing: Callable[[Any], bool] | None = None   # refused fields: the values accepted all the same


def _one_of(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value in values


def _implemented(note: str, endpoints: tuple[str, ...] = BOTH) -> Field:
    return Field(endpoints, IMPLEMENTED, note)


def _inert(note: str, endpoints: tuple[str, ...] = BOTH) -> Field:
    return Field(endpoints, INERT, note)


def _is_null(value: Any) -> bool:
    return value is None


def _refused(note: str, asks_nothing: Callable[[Any], bool] = _is_null,
             endpoints: tuple[str, ...] = (CHAT,)) -> Field:
    return Field(endpoints, REFUSED, note, asks_nothing)


FIELDS: dict[str, Field] = {
    "model": _inert("one model is served; any id is answered by it (GET /v1/models names it)"),
    "messages": _implemented("roles system, developer (as system unless the chat template names developer), "
                             "user, assistant (with tool_calls), tool (with tool_call_id); text, image_url "
                             "(data: URLs) and input_audio (wav) parts", (CHAT,)),
    "prompt": _implemented("a string, a list of strings, a list of token ids or a list of token-id lists; "
                           "one choice (n of them) per prompt", (COMPLETIONS,)),
    "max_tokens": _implemented("new tokens at most (0 only with echo); cut to the room max_all_tokens leaves"),
    "max_completion_tokens": _implemented("the same as max_tokens", (CHAT,)),
    "temperature": _implemented("0 is greedy; otherwise the sampler's temperature"),
    "top_p": _implemented("the sampler's top_p"),
    "seed": _implemented("seeds the request's sampler: the same request and seed give the same reply"),
    "stop": _implemented("a string or up to 4; the reply ends before the first one"),
    "stream": _implemented("server-sent events, then data: [DONE]"),
    "stream_options": _implemented("include_usage: a last event with usage; include_obfuscation is inert"),
    "n": _implemented("choices per prompt, each in a slot of its own (at once where slots are free), seeded seed + index"),
    "presence_penalty": _implemented("-2 to 2, subtracted from the logit of every token already generated"),
    "frequency_penalty": _implemented("-2 to 2, times how often a token was generated, subtracted from its logit"),
    "logit_bias": _implemented("token id -> -100 to 100, added to that token's logit before sampling"),
    "logprobs": _implemented("chat: true for each token's log-probability; completions: 0 to 20 alternatives "
                             "(tokens, token_logprobs, top_logprobs, text_offset); log-softmax of the full logits "
                             "before any sampler step"),
    "top_logprobs": _implemented("0 to 20 most likely alternatives per token; needs logprobs", (CHAT,)),
    "echo": _implemented("the prompt comes back before the reply, with its tokens' logprobs when logprobs is "
                         "set (the first token's is null)", (COMPLETIONS,)),
    "best_of": _refused("no best-of search; only 1",
                        lambda value: value is None or value == 1, (COMPLETIONS,)),
    "suffix": _refused("no text insertion; only null or \"\"", _one_of(None, ""), (COMPLETIONS,)),
    "response_format": _implemented("text; json_object; json_schema (name, schema, strict, description: the schema "
                                    "is always enforced); extensions {type: grammar, grammar: LARK} and {type: regex, "
                                    "regex: PATTERN}. A grammar masks every token (see Structured output)", (CHAT,)),
    "tools": _implemented("function tools, rendered by the model's chat template as its `tools`; the calls the "
                          "reply writes in the Hermes format come back as tool_calls (see Tool calls)", (CHAT,)),
    "tool_choice": _implemented("none (tools left out of the prompt), auto, required, or a named function; "
                                "required and a named function are enforced by a grammar", (CHAT,)),
    "functions": _refused("no function calls (the older tools); only an empty list", _one_of(None, [])),
    "function_call": _refused("no function calls (the older tool_choice); only \"none\"", _one_of(None, "none")),
    "parallel_tool_calls": _implemented("true (default): several calls in one reply; false: at most one (with "
                                        "auto, calls after the first are dropped)", (CHAT,)),
    "audio": _refused("no audio replies"),
    "modalities": _refused("text replies only: only [\"text\"]", lambda value: value is None or value == ["text"]),
    "prediction": _refused("no predicted outputs"),
    "reasoning_effort": _refused("not read: the chat template decides whether the model reasons"),
    "verbosity": _refused("not read"),
    "web_search_options": _refused("no web search: the server fetches nothing"),
    "moderation": _refused("no moderation"),
    "user": _inert("not stored"),
    "safety_identifier": _inert("not stored", (CHAT,)),
    "metadata": _inert("not stored", (CHAT,)),
    "store": _inert("nothing is stored", (CHAT,)),
    "service_tier": _inert("one tier", (CHAT,)),
    "prompt_cache_key": _inert("the KV cache is reused by prompt text (reuse_kv), not by key", (CHAT,)),
    "prompt_cache_options": _inert("as prompt_cache_key", (CHAT,)),
    "prompt_cache_retention": _inert("as prompt_cache_key", (CHAT,)),
}

STREAM_OPTIONS = {"include_usage": IMPLEMENTED, "include_obfuscation": INERT}


def refused_field(body: dict, endpoint: str) -> tuple[str, str, str | None] | None:
    """(field, message, code) for the first field this endpoint does not know, or the first refused
    field that asks for something; None when every field is accepted."""
    for name, value in body.items():
        known = FIELDS.get(name)
        if known is None or endpoint not in known.endpoints:
            where = "/v1/chat/completions" if endpoint == CHAT else "/v1/completions"
            return name, f"unknown field '{name}' for {where} (docs/server.md lists the fields)", "unknown_field"
        if known.status == REFUSED and not known.asks_nothing(value):
            return name, f"'{name}' is not supported: {known.note}", "unsupported_field"
    return None


def markdown_table() -> str:
    """The table as docs/server.md shows it."""
    lines = ["| field | endpoints | status | what the server does |", "| --- | --- | --- | --- |"]
    for name, known in FIELDS.items():
        endpoints = ", ".join(known.endpoints)
        lines.append(f"| `{name}` | {endpoints} | {known.status} | {known.note.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
