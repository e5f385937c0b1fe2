"""POST /tokenize and POST /detokenize: the served model's own tokenizer, so a client (an
evaluation harness) counts and cuts tokens exactly as the server does.

    {"prompt": "text", "add_special_tokens": true}          -> {"tokens": [...], "count": n, "max_model_len": m}
    {"messages": [...], "add_generation_prompt": true}      -> the same, for the chat template's text
    {"tokens": [ids]}                                       -> {"prompt": "text"}

`add_special_tokens` false leaves out the ids the tokenizer puts before every text (a BOS);
`return_token_strs` true adds each id's text.
"""

from __future__ import annotations

from typing import Any

from mnngpu.apps.server.protocol import ApiError
from mnngpu.errors import MnnGpuError

TOKENIZE_FIELDS = ("model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "return_token_strs")


def tokenize(llm, body: dict) -> dict:
    _refuse_unknown(body, TOKENIZE_FIELDS)
    add_special = _flag(body, "add_special_tokens", True)
    if "messages" in body and "prompt" in body:
        raise ApiError(400, "give 'prompt' or 'messages', not both", param="messages")
    try:
        if "messages" in body:
            text = _chat_text(llm, body)
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise ApiError(400, "expected 'prompt' (a string) or 'messages'", param="prompt")
        ids = llm.tokenizer_encode(text)
    except MnnGpuError as exc:
        raise ApiError(400, str(exc), param=exc.field or "prompt") from None
    prefix = llm.tokenizer.prefix_ids
    if not add_special and prefix and ids[:len(prefix)] == prefix:
        ids = ids[len(prefix):]
    reply: dict[str, Any] = {"tokens": ids, "count": len(ids), "max_model_len": llm.config.max_all_tokens}
    if _flag(body, "return_token_strs", False):
        reply["token_strs"] = [llm.tokenizer.decode(i) for i in ids]
    return reply


def detokenize(llm, body: dict) -> dict:
    _refuse_unknown(body, ("model", "tokens"))
    ids = body.get("tokens")
    vocab = llm.embedding.vocab_size
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab
                                            for i in ids):
        raise ApiError(400, f"expected 'tokens' to be a list of token ids in [0, {vocab})", param="tokens")
    decoder = llm.tokenizer.stream_decoder()
    return {"prompt": "".join(decoder.feed(i) for i in ids) + decoder.flush()}


def _chat_text(llm, body: dict) -> str:
    from mnngpu.apps.server.protocol import for_template, parse_chat_request

    messages = for_template(parse_chat_request({"messages": body["messages"]}).messages, llm.prompt.template_source)
    return llm.prompt.apply_chat_template(messages, _flag(body, "add_generation_prompt", True))


def _refuse_unknown(body: dict, known: tuple[str, ...]) -> None:
    unknown = next((name for name in body if name not in known), None)
    if unknown is not None:
        raise ApiError(400, f"unknown field '{unknown}' (expected some of {', '.join(known)})", param=unknown)


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"expected true or false, got {value!r}", param=name)
    return value
