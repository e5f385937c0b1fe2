"""Multi-turn chat over one Llm: which text its KV cache holds, and a reply to a new prompt.

    session = ChatSession(llm)
    session.ask("Hello").text          # prefills the templated turn
    session.ask("And then?").text      # with reuse_kv: only what the template adds after the reply

With `reuse_kv`, a prompt that starts with the text already in the cache (the previous prompt
and its reply) prefills only the rest: for a ChatML template, the end-of-turn marker after
the reply and the new templated user turn. Like MNN, generation never feeds the stop id that
ended a reply into the cache; the template's end-of-turn text comes in with the next turn.
A prompt that does not extend the cached text (an edited history, a template that rewrites
earlier turns) clears the cache and is prefilled whole, so the cache always holds exactly
the text it is said to hold.

With `prefix_cache_path`, a prompt prefilled from an empty cache first takes its system turn's
keys and values from the prefix cache (mnngpu/runtime/prefix_cache.py), stored there by the
first session that used the same system prompt, so a new session prefills only the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mnngpu.errors import InputError

FinishReason = str  # "stop" (a stop id), "length" (max_new_tokens) or "cancelled" (on_text said stop)


@dataclass
class Reply:
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int   # every prompt token the reply was conditioned on: cached ones and new ones
    cached_tokens: int   # of those, the ones reused from the KV cache (not prefilled again)


class PromptCache:
    """The text whose tokens are in the Llm's KV cache, in order."""

    def __init__(self, llm):
        self.llm = llm
        self.text = ""
        self.prefilled_now = 0   # tokens ids_for prefilled itself for the current prompt (a new prefix)

    def ids_for(self, prompt: str, prefix: str = "") -> list[int]:
        """The ids to prefill for `prompt`: only its new part when the cache holds the rest, or
        when the prefix cache holds `prefix` (the prompt's system turn)."""
        self.prefilled_now = 0
        if self.llm.config.reuse_kv and self.text and prompt.startswith(self.text) and prompt != self.text:
            return continuation_ids(self.llm.tokenizer, prompt[len(self.text):])
        self.clear()
        ids = self.llm.tokenizer_encode(prompt)
        if prefix and self.llm.prefix_cache is not None and prompt.startswith(prefix):
            head = self.llm.tokenizer_encode(prefix)
            if len(head) < len(ids) and ids[: len(head)] == head:  # the prompt's ids start with the prefix's
                self.prefilled_now = len(head) - self.llm.cache_prefix(head)
                self.text = prefix
                return ids[len(head):]
        return ids

    def clear(self) -> None:
        self.llm.reset()
        self.text = ""

    @property
    def tokens(self) -> int:
        """How many tokens the cache holds (after a clear, none, though the memory is freed later)."""
        return self.llm.runtime.kv_meta.kept


def continuation_ids(tokenizer, text: str) -> list[int]:
    """The ids of `text` as it continues a sequence: without the tokenizer's prefix (BOS) ids."""
    return tokenizer.encode(text)[len(tokenizer.prefix_ids):]


def system_prefix(llm, messages: list[dict]) -> str:
    """The templated text of the messages' leading system turn ("" without one): what a prompt
    rendered from these messages starts with and another session with the same system prompt shares."""
    if not messages or messages[0].get("role") != "system":
        return ""
    return llm.prompt.render(messages[:1], add_generation_prompt=False)


def generate_reply(llm, cache: PromptCache, prompt: str, max_new_tokens: int | None = None,
                   on_text: Callable[[str], bool | None] | None = None, prefix: str = "") -> Reply:
    """Generate after `prompt`, reusing what `cache` holds (and the prefix cache's keys and values
    for `prefix`, the prompt's system turn); at most `max_new_tokens` (the config's when None),
    fewer when max_all_tokens leaves less room.

    `on_text(piece)` hears the text each new token completes (often "", while a UTF-8
    sequence is unfinished), then once more with what is left at the end; returning True
    stops the reply after that token (finish_reason "cancelled").
    """
    limit = llm.config.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
    if limit < 1:
        raise InputError(f"expected at least 1 new token, got {limit}", field="max_new_tokens")
    ids = cache.ids_for(prompt, prefix)
    held = cache.tokens
    room = llm.config.max_all_tokens - held - len(ids)
    if room < 1:
        raise InputError(f"the prompt's {held + len(ids)} tokens leave no room for a reply",
                         field="max_all_tokens")
    limit = min(limit, room)
    decoder = llm.tokenizer.stream_decoder()
    pieces: list[str] = []
    cancelled = []

    def on_token(token: int) -> bool:
        piece = decoder.feed(token)
        pieces.append(piece)
        if on_text is not None and on_text(piece):
            cancelled.append(token)
        return bool(cancelled)

    try:
        out = llm.generate(ids, limit, on_token)
    except BaseException:
        cache.clear()  # a forward cut short leaves the cache in no state we can name
        raise
    tail = decoder.flush()
    if tail:
        pieces.append(tail)
        if on_text is not None:
            on_text(tail)
    text = "".join(pieces)
    cache.text = prompt + text  # every emitted token is in the cache; the stop id is not
    finish = "cancelled" if cancelled else "length" if len(out) >= limit else "stop"
    # a prefix prefilled for this prompt is not reused; a stored one generate() found by itself is
    reused = held - cache.prefilled_now + llm.context.prefix_cached
    return Reply(text, list(out), finish, held + len(ids), reused)


class ChatSession:
    """A conversation: the messages so far, rendered with the model's chat template each turn."""

    def __init__(self, llm, system_prompt: str | None = None):
        self.llm = llm
        self.cache = PromptCache(llm)
        self.system_prompt = llm.config.system_prompt if system_prompt is None else system_prompt
        self.messages: list[dict] = []
        self.reset()

    def reset(self) -> None:
        """Forget the conversation and the KV cache."""
        self.cache.clear()
        self.messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []

    def ask(self, user_text: str, on_text: Callable[[str], bool | None] | None = None,
            max_new_tokens: int | None = None) -> Reply:
        messages = [*self.messages, {"role": "user", "content": user_text}]
        reply = generate_reply(self.llm, self.cache, self.llm.apply_chat_template(messages), max_new_tokens,
                               on_text, system_prefix(self.llm, messages))
        self.messages = [*messages, {"role": "assistant", "content": reply.text}]
        return reply


__all__ = ["ChatSession", "PromptCache", "Reply", "continuation_ids", "generate_reply", "system_prefix"]
