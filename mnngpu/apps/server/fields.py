"""The one table of request fields: every field of OpenAI's chat-completions and completions
requests, of Anthropic's Messages API and of OpenAI's Responses API, and what this server does
with it. The two APIs' rows are keyed "messages:NAME" and "responses:NAME" (`field_row`), since
the same names mean other things there.

    implemented  the field does what OpenAI's API says (see its note for the limits)
    inert        accepted, and changes nothing a client can see (`user`, `metadata`, ...)
    refused      a 400 naming the field, unless its value is one that asks for nothing
                 (null, or the value the note names)

A field not in the table is refused with a 400 naming it too. A few fields are not OpenAI's but
vLLM's and llama-server's (`extension`); clients send them in the body (`extra_body`). A field given as null counts as
absent, as in OpenAI's API. docs/server.md shows the table (`markdown_table`); a test checks
that it covers every field of the installed `openai` and `anthropic` packages' request types.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

IMPLEMENTED, INERT, REFUSED = "implemented", "inert", "refused"
CHAT, COMPLETIONS = "chat", "completions"
BOTH = (CHAT, COMPLETIONS)
MESSAGES, RESPONSES = "messages", "responses"   # Anthropic's POST /v1/messages, OpenAI's POST /v1/responses
EMBEDDINGS = "embeddings"   # OpenAI's POST /v1/embeddings (embeddings.py)
RERANK = "rerank"   # POST /v1/rerank and /rerank, the shape llama-server, vLLM and Cohere's v1 take (rerank.py)
ROUTES = {CHAT: "/v1/chat/completions", COMPLETIONS: "/v1/completions", MESSAGES: "/v1/messages",
          RESPONSES: "/v1/responses", EMBEDDINGS: "/v1/embeddings", RERANK: "/v1/rerank"}


@dataclass(frozen=True)
class Field:
    endpoints: tuple[str, ...]
    status: str
    note: str
    asks_nothing: Callable[[Any], bool] | None = None   # refused fields: the values accepted all the same
    extension: bool = False   # not in OpenAI's API; vLLM and llama-server read it


def _one_of(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value in values


def _implemented(note: str, endpoints: tuple[str, ...] = BOTH) -> Field:
    return Field(endpoints, IMPLEMENTED, note)


def _extension(note: str, endpoints: tuple[str, ...] = (CHAT,)) -> Field:
    return Field(endpoints, IMPLEMENTED, "extension (vLLM, llama-server): " + note, extension=True)


def _inert(note: str, endpoints: tuple[str, ...] = BOTH) -> Field:
    return Field(endpoints, INERT, note)


def _is_null(value: Any) -> bool:
    return value is None


def _refused(note: str, asks_nothing: Callable[[Any], bool] = _is_null,
             endpoints: tuple[str, ...] = (CHAT,)) -> Field:
    return Field(endpoints, REFUSED, note, asks_nothing)


FIELDS: dict[str, Field] = {
    "model": _implemented("picks the served model by its id (GET /v1/models; a 404 names the served ones); with one model served, any id is answered by it"),
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
    "reasoning_effort": _implemented("for a model whose chat template thinks (see Thinking models): \"none\" "
                                     "and \"minimal\" set the template's enable_thinking to false; \"low\", "
                                     "\"medium\" and \"high\" keep thinking on and are otherwise the same (use "
                                     "thinking_budget_tokens to bound it); any value on a model that does not "
                                     "think, or \"none\" on one that cannot stop, is a 400", (CHAT,)),
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
    "chat_template_kwargs": _extension("an object of variables for the chat template (e.g. {\"enable_thinking\": "
                                       "false}), over the model's jinja.context; the template's own variables "
                                       "(messages, tools, add_generation_prompt, bos_token, eos_token) are a 400"),
    "thinking_budget_tokens": _extension("tokens the model may think (inside its think block) before the server "
                                         "writes the block's end marker into the reply and the answer follows; "
                                         "0 closes the block at once, -1 is no bound (default: serve's "
                                         "--reasoning-budget)"),
}


def _messages(status: str, note: str, asks_nothing: Callable[[Any], bool] | None = None) -> Field:
    """A row of Anthropic's messages API; its key is "messages:NAME"."""
    return Field((MESSAGES,), status, note, _is_null if status == REFUSED and asks_nothing is None else asks_nothing)


def _responses(status: str, note: str, asks_nothing: Callable[[Any], bool] | None = None) -> Field:
    """A row of OpenAI's Responses API; its key is "responses:NAME"."""
    return Field((RESPONSES,), status, note, _is_null if status == REFUSED and asks_nothing is None else asks_nothing)


# The fields of the two APIs that are translated onto the chat route (anthropic_messages.py,
# openai_responses.py): a row each, as their names mean other things there.
FIELDS.update({
    "messages:model": _messages(IMPLEMENTED, "picks the served model by its id (GET /v1/models; a 404 names the served ones); with one model served, any id is answered by it"),
    "messages:messages": _messages(IMPLEMENTED, "user and assistant turns (and system ones): text, image (base64, "
                                                "or a url source that is a data: URL), tool_use and tool_result "
                                                "blocks; thinking blocks of earlier turns are dropped; a last "
                                                "assistant turn (a prefill) is refused"),
    "messages:system": _messages(IMPLEMENTED, "a string or text blocks: the prompt's first system message"),
    "messages:max_tokens": _messages(IMPLEMENTED, "required: new tokens at most (stop_reason max_tokens)"),
    "messages:stop_sequences": _messages(IMPLEMENTED, "up to 4 non-empty strings; the reply ends before the first "
                                                      "(stop_reason stop_sequence, and stop_sequence names it)"),
    "messages:temperature": _messages(IMPLEMENTED, "0 to 1; 0 is greedy (the anthropic 2.x client sends it in "
                                                   "extra_body)"),
    "messages:top_p": _messages(IMPLEMENTED, "the sampler's top_p (sent as temperature is)"),
    "messages:top_k": _messages(IMPLEMENTED, "the sampler's top_k, at least 1 (sent as temperature is)"),
    "messages:stream": _messages(IMPLEMENTED, "Anthropic's events: message_start, content_block_start, "
                                              "content_block_delta, content_block_stop, message_delta, message_stop"),
    "messages:tools": _messages(IMPLEMENTED, "custom tools {name, description, input_schema}, rendered by the chat "
                                             "template as function tools (see Tool calls); server tools are refused"),
    "messages:tool_choice": _messages(IMPLEMENTED, "auto, any (a call enforced by a grammar), tool (that one, "
                                                   "likewise), none; disable_parallel_tool_use"),
    "messages:thinking": _messages(IMPLEMENTED, "for a thinking model (see Thinking models): enabled sets the "
                                                "template's enable_thinking and budget_tokens bounds the block; "
                                                "disabled turns it off; adaptive keeps the template's default. The "
                                                "reasoning comes back as a thinking block (signature \"\")"),
    "messages:output_config": _messages(IMPLEMENTED, "format {type: json_schema, schema}: the reply follows the "
                                                     "schema (see Structured output); effort is refused"),
    "messages:metadata": _messages(INERT, "not stored"),
    "messages:cache_control": _messages(INERT, "the KV cache is reused by prompt text (reuse_kv), not by marks"),
    "messages:container": _messages(REFUSED, "no code execution containers"),
    "messages:diagnostics": _messages(INERT, "no cache diagnostics are given"),
    "messages:inference_geo": _messages(INERT, "served here"),
    "messages:service_tier": _messages(INERT, "one tier"),
    "messages:speed": _messages(INERT, "one speed"),
    "messages:user_profile_id": _messages(INERT, "not stored"),
    "messages:workspace_id": _messages(INERT, "not stored"),
    "responses:model": _responses(IMPLEMENTED, "picks the served model by its id (GET /v1/models; a 404 names the served ones); with one model served, any id is answered by it"),
    "responses:input": _responses(IMPLEMENTED, "a string, or items: messages (roles user, system, developer, "
                                               "assistant; input_text, input_image (data: URLs) and output_text "
                                               "parts), function_call and function_call_output; reasoning items "
                                               "are dropped"),
    "responses:instructions": _responses(IMPLEMENTED, "a system message before the input (a later response does "
                                                      "not inherit it)"),
    "responses:max_output_tokens": _responses(IMPLEMENTED, "new tokens at most (status incomplete, reason "
                                                           "max_output_tokens)"),
    "responses:temperature": _responses(IMPLEMENTED, "0 to 2; 0 is greedy"),
    "responses:top_p": _responses(IMPLEMENTED, "the sampler's top_p"),
    "responses:stream": _responses(IMPLEMENTED, "the Responses events, each with its sequence_number (see "
                                                "docs/server.md)"),
    "responses:stream_options": _responses(INERT, "include_obfuscation: no obfuscation is added"),
    "responses:tools": _responses(IMPLEMENTED, "function tools {type: function, name, description, parameters, "
                                               "strict} (see Tool calls); hosted tools are refused"),
    "responses:tool_choice": _responses(IMPLEMENTED, "none, auto, required, or {type: function, name}"),
    "responses:parallel_tool_calls": _responses(IMPLEMENTED, "as for chat completions"),
    "responses:text": _responses(IMPLEMENTED, "format: text, json_object, or json_schema {name, schema, strict, "
                                              "description} (see Structured output); verbosity only null"),
    "responses:reasoning": _responses(IMPLEMENTED, "effort, as chat's reasoning_effort (see Thinking models); "
                                                   "summary is inert. The reasoning comes back as a reasoning item"),
    "responses:store": _responses(IMPLEMENTED, "true (default): the response is kept in memory (the last 256) "
                                               "for previous_response_id and GET /v1/responses/{id}"),
    "responses:previous_response_id": _responses(IMPLEMENTED, "continues a stored response: its input and output "
                                                              "come before this input"),
    "responses:metadata": _responses(INERT, "returned with the response, not read"),
    "responses:include": _responses(REFUSED, "no extra output data; only []", lambda value: value in (None, [])),
    "responses:truncation": _responses(REFUSED, "a prompt too long is refused; only \"disabled\"",
                                       lambda value: value in (None, "disabled")),
    "responses:top_logprobs": _responses(REFUSED, "no log-probabilities here; only 0",
                                         lambda value: value in (None, 0)),
    "responses:max_tool_calls": _responses(REFUSED, "no cap on tool calls"),
    "responses:background": _responses(REFUSED, "no background responses; only false",
                                       lambda value: value in (None, False)),
    "responses:background_options": _responses(REFUSED, "no background responses"),
    "responses:conversation": _responses(REFUSED, "no conversation objects; use previous_response_id"),
    "responses:context_management": _responses(REFUSED, "no context management"),
    "responses:prompt": _responses(REFUSED, "no stored prompt templates"),
    "responses:moderation": _responses(REFUSED, "no moderation"),
    "responses:image": _responses(REFUSED, "no image options"),
    "responses:access_programs": _responses(REFUSED, "no access programs"),
    "responses:user": _responses(INERT, "not stored"),
    "responses:safety_identifier": _responses(INERT, "not stored"),
    "responses:service_tier": _responses(INERT, "one tier"),
    "responses:prompt_cache_key": _responses(INERT, "the KV cache is reused by prompt text (reuse_kv), not by key"),
    "responses:prompt_cache_options": _responses(INERT, "as prompt_cache_key"),
    "responses:prompt_cache_retention": _responses(INERT, "as prompt_cache_key"),
})



def _embeddings(status: str, note: str) -> Field:
    """A row of OpenAI's embeddings API; its key is "embeddings:NAME"."""
    return Field((EMBEDDINGS,), status, note)


FIELDS.update({
    "embeddings:input": _embeddings(IMPLEMENTED, "a string, a list of strings, a list of token ids or a list of "
                                                 "token-id lists (at most 2048); a string gets the model's template "
                                                 "(as txt_embedding), token ids are embedded as given"),
    "embeddings:model": _embeddings(IMPLEMENTED, "picks the served model (GET /v1/models); an LLM is refused"),
    "embeddings:encoding_format": _embeddings(IMPLEMENTED, "float (default) or base64 (little-endian float32)"),
    "embeddings:dimensions": _embeddings(IMPLEMENTED, "Matryoshka truncation, then unit length again; only for a "
                                                      "model whose config sets matryoshka true, else a 400"),
    "embeddings:user": _embeddings(INERT, "not stored"),
})


def _rerank(status: str, note: str, asks_nothing: Callable[[Any], bool] | None = None) -> Field:
    """A row of the rerank API; its key is "rerank:NAME"."""
    return Field((RERANK,), status, note, _is_null if status == REFUSED and asks_nothing is None else asks_nothing)


FIELDS.update({
    "rerank:query": _rerank(IMPLEMENTED, "the query, a non-empty string"),
    "rerank:documents": _rerank(IMPLEMENTED, "strings, or objects with a text field (at most 2048)"),
    "rerank:model": _rerank(IMPLEMENTED, "picks the served model (GET /v1/models); only a reranker answers"),
    "rerank:top_n": _rerank(IMPLEMENTED, "the most relevant n results (default: all)"),
    "rerank:return_documents": _rerank(IMPLEMENTED, "each result carries its document's text (default: false)"),
    "rerank:instruct": _rerank(IMPLEMENTED, "extension: the instruction of Qwen3-Reranker's prompt (default: empty, "
                                            "as MNN's)"),
    "rerank:rank_fields": _rerank(REFUSED, "documents are text; only null"),
    "rerank:max_chunks_per_doc": _rerank(REFUSED, "a document is not cut into chunks; only null"),
})

STREAM_OPTIONS = {"include_usage": IMPLEMENTED, "include_obfuscation": INERT}


def field_row(name: str, endpoint: str) -> Field | None:
    """The row of field `name` for `endpoint`, or None when the endpoint has no such field."""
    known = FIELDS.get(name if endpoint in BOTH else f"{endpoint}:{name}")
    return known if known is not None and endpoint in known.endpoints else None


def field_names(endpoint: str) -> set[str]:
    """Every field `endpoint` knows."""
    return {key.rpartition(":")[2] for key, known in FIELDS.items() if endpoint in known.endpoints}


def refused_field(body: dict, endpoint: str) -> tuple[str, str, str | None] | None:
    """(field, message, code) for the first field this endpoint does not know, or the first refused
    field that asks for something; None when every field is accepted."""
    for name, value in body.items():
        known = field_row(name, endpoint)
        if known is None:
            message = f"unknown field '{name}' for {ROUTES[endpoint]} (docs/server.md lists the fields)"
            return name, message, "unknown_field"
        if known.status == REFUSED and not known.asks_nothing(value):
            return name, f"'{name}' is not supported: {known.note}", "unsupported_field"
    return None


def markdown_table() -> str:
    """The table as docs/server.md shows it."""
    lines = ["| field | endpoints | status | what the server does |", "| --- | --- | --- | --- |"]
    for key, known in FIELDS.items():
        name, endpoints = key.rpartition(":")[2], ", ".join(known.endpoints)
        lines.append(f"| `{name}` | {endpoints} | {known.status} | {known.note.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
