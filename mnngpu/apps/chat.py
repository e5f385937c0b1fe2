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

A reply ends at MNN's stop ids and also at the chat markup of another turn (see
`reply_stop_ids`), and special tokens never show in its text unless asked for.

With `prefix_cache_path`, a prompt prefilled from an empty cache first takes its system turn's
keys and values from the prefix cache (mnngpu/runtime/prefix_cache.py), stored there by the
first session that used the same system prompt, so a new session prefills only the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from mnngpu.errors import InputError, MnnGpuError

# Special tokens that end a text wherever a tokenizer has them (the exporter knows some by name too).
END_OF_TEXT_MARKERS = ("<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "</s>",
                       "<eos>")
_PROBE = "\x00probe\x00"

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
        self._markup: ReplyMarkup | None = None

    @property
    def markup(self) -> ReplyMarkup:
        if self._markup is None:
            self._markup = reply_markup(self.llm)
        return self._markup

    def ids_for(self, prompt: str, prefix: str = "") -> list[int]:
        """The ids to prefill for `prompt`: only its new part when the cache holds the rest, or
        when the prefix cache holds `prefix` (the prompt's system turn)."""
        self.prefilled_now = 0
        if (self.llm.config.reuse_kv and self.text and prompt.startswith(self.text) and prompt != self.text
                and not has_media(prompt[len(self.text):])):
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


def has_media(text: str) -> bool:
    """Whether `text` names an image or audio part (<img>…</img>): such a part is encoded by the
    model's tokenizer_encode, with the whole prompt."""
    from mnngpu.omni import MEDIA_TAG

    return MEDIA_TAG.search(text) is not None


def continuation_ids(tokenizer, text: str) -> list[int]:
    """The ids of `text` as it continues a sequence: without the tokenizer's prefix (BOS) ids."""
    return tokenizer.encode(text)[len(tokenizer.prefix_ids):]


@dataclass(frozen=True)
class ReplyMarkup:
    """The chat markup a reply may hold, from the tokenizer and the chat template.

    `stop_ids`: MNN's stop ids; the special tokens the template writes after a message's content
    (its end of turn); the template's and the tokenizer's eos and bos; and the usual end-of-text
    markers among the special tokens (`<|endoftext|>`: a new document begins).
    `opening_id` and `opening_rest`: the assistant turn's opening (`<|im_start|>` and
    `assistant\n`), which some models write again at the start of their reply."""

    stop_ids: frozenset[int]
    opening_id: int | None = None
    opening_rest: str = ""


def reply_markup(llm) -> ReplyMarkup:
    tokenizer, prompt = llm.tokenizer, llm.prompt
    named = {prompt.eos, prompt.bos, tokenizer.eos_token, tokenizer.bos_token, *END_OF_TEXT_MARKERS} - {None, ""}
    end_of_turn, opening = _turn_markup(prompt)
    specials = {token_id: tokenizer.decode(token_id) for token_id in tokenizer.special_ids}
    stops = set(tokenizer.stop_ids)
    stops.update(i for i, text in specials.items() if text and (text in named or text in end_of_turn))
    opener = next((i for i, text in specials.items() if text and opening.startswith(text)), None)
    if opener is None or opener in stops:
        return ReplyMarkup(frozenset(stops))
    return ReplyMarkup(frozenset(stops), opener, opening[len(specials[opener]):])


def _turn_markup(prompt) -> tuple[str, str]:
    """The template's text after a user message's content, and the assistant turn's opening."""
    turn = [{"role": "user", "content": _PROBE}]
    try:
        closed, opened = prompt.render(turn, False), prompt.render(turn, True)
    except MnnGpuError:
        return "", ""
    after = closed.partition(_PROBE)[2]
    return after, opened[len(closed):] if opened.startswith(closed) else ""


class _RepeatedOpening:
    """Holds back the text after a hidden turn-opening token, and drops it when it is the rest of
    the opening (`assistant\n`); any other text is let out as it was."""

    def __init__(self, rest: str):
        self.rest = rest
        self.held: str | None = None

    def opened(self) -> None:
        self.held = ""

    def feed(self, piece: str) -> str:
        if self.held is None:
            return piece
        self.held += piece
        if self.held.startswith(self.rest):
            return self._let_out(self.held[len(self.rest):])
        return "" if self.rest.startswith(self.held) else self._let_out(self.held)

    def flush(self) -> str:
        return self._let_out(self.held or "")

    def _let_out(self, text: str) -> str:
        self.held = None
        return text


def system_prefix(llm, messages: list[dict]) -> str:
    """The templated text of the messages' leading system turn ("" without one): what a prompt
    rendered from these messages starts with and another session with the same system prompt shares."""
    if not messages or messages[0].get("role") != "system":
        return ""
    return llm.prompt.render(messages[:1], add_generation_prompt=False)


def generate_reply(llm, cache: PromptCache, prompt: str, max_new_tokens: int | None = None,
                   on_text: Callable[[str], bool | None] | None = None, show_special: bool = False,
                   prefix: str = "", shown_ids: Collection[int] = frozenset()) -> Reply:
    """Generate after `prompt`, reusing what `cache` holds (and the prefix cache's keys and values
    for `prefix`, the prompt's system turn); at most `max_new_tokens` (the config's when None),
    fewer when max_all_tokens leaves less room.

    `on_text(piece)` hears the text each new token completes (often "", while a UTF-8
    sequence is unfinished), then once more with what is left at the end; returning True
    stops the reply after that token (finish_reason "cancelled"). A special token's text is
    left out of the reply unless `show_special`, or unless it is in `shown_ids` (a think marker).
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
    tokenizer, markup = llm.tokenizer, cache.markup
    decoder = tokenizer.stream_decoder()
    opening = _RepeatedOpening(markup.opening_rest)
    pieces: list[str] = []
    in_cache: list[str] = []  # the text with the hidden markup: what the cache holds
    cancelled = []

    def on_token(token: int) -> bool:
        if tokenizer.is_special(token) and not show_special and token not in shown_ids:
            text = decoder.flush()
            in_cache.append(text + tokenizer.decode(token))
            piece = opening.feed(text)
            if token == markup.opening_id:
                opening.opened()
        else:
            text = decoder.feed(token)
            in_cache.append(text)
            piece = opening.feed(text)
        pieces.append(piece)
        if on_text is not None and on_text(piece):
            cancelled.append(token)
        return bool(cancelled)

    try:
        out = llm.generate(ids, limit, on_token, stop_ids=markup.stop_ids)
    except BaseException:
        cache.clear()  # a forward cut short leaves the cache in no state we can name
        raise
    rest = decoder.flush()
    in_cache.append(rest)
    tail = opening.feed(rest) + opening.flush()
    if tail:
        pieces.append(tail)
        if on_text is not None:
            on_text(tail)
    text = "".join(pieces)
    cache.text = prompt + "".join(in_cache)  # every emitted token is in the cache; the stop id is not
    finish = "cancelled" if cancelled else "length" if len(out) >= limit else "stop"
    # a prefix prefilled for this prompt is not reused; a stored one generate() found by itself is
    reused = held - cache.prefilled_now + llm.context.prefix_cached
    return Reply(text, list(out), finish, held + len(ids), reused)


class ChatSession:
    """A conversation: the messages so far, rendered with the model's chat template each turn.

    For a model that thinks (mnngpu/apps/server/reasoning.py), `thinking` says so, and
    set_thinking() switches the template's enable_thinking where it has one."""

    def __init__(self, llm, system_prompt: str | None = None, show_special: bool = False):
        from mnngpu.apps.server.reasoning import detect_thinking

        self.llm = llm
        self.show_special = show_special
        self.cache = PromptCache(llm)
        self.system_prompt = llm.config.system_prompt if system_prompt is None else system_prompt
        self.messages: list[dict] = []
        self.variables: dict = {}   # template variables beside jinja.context (enable_thinking)
        self.thinking = detect_thinking(llm.prompt, llm.tokenizer)
        self.reset()

    def set_thinking(self, on: bool) -> None:
        """Turn the model's thinking on or off for the next turns; InputError when its template
        cannot switch it."""
        if self.thinking is None:
            raise InputError("this model does not think: its chat template writes no think block", field="/think")
        if self.thinking.switch is None:
            raise InputError("this model's chat template cannot switch thinking (it reads no enable_thinking); it "
                             "thinks on every reply", field="/think")
        self.variables[self.thinking.switch] = on

    def opens_thinking(self, user_text: str) -> bool:
        """Whether the prompt for `user_text` ends inside a think block (the reply starts in it)."""
        return self.thinking is not None and self.thinking.opens_block(self._prompt_with(user_text))

    def reset(self) -> None:
        """Forget the conversation and the KV cache."""
        self.cache.clear()
        self.messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []

    def ask(self, user_text: str, on_text: Callable[[str], bool | None] | None = None,
            max_new_tokens: int | None = None) -> Reply:
        messages = [*self.messages, {"role": "user", "content": user_text}]
        shown = frozenset() if self.thinking is None else self.thinking.special_ids
        reply = generate_reply(self.llm, self.cache, self._prompt_with(user_text), max_new_tokens, on_text,
                               show_special=self.show_special, prefix=system_prefix(self.llm, messages),
                               shown_ids=shown)
        self._add_turn(user_text, reply.text)
        return reply

    def keep_interrupted(self, user_text: str, partial_reply: str) -> None:
        """A reply cut short by an exception: keep the turn as far as it was shown (not at all when
        nothing was)."""
        if partial_reply:
            self._add_turn(user_text, partial_reply)

    def make_room(self, user_text: str, max_new_tokens: int | None = None) -> int:
        """Drop the oldest turns until asking `user_text` leaves room for a reply of max_new_tokens
        (the config's when None; at most a quarter of max_all_tokens). Returns how many were dropped."""
        config = self.llm.config
        wanted = min(config.max_new_tokens if max_new_tokens is None else max_new_tokens,
                     config.max_all_tokens // 4)
        dropped = 0
        while (self._first_turn() is not None
               and len(self.llm.tokenizer_encode(self._prompt_with(user_text))) + wanted > config.max_all_tokens):
            start = self._first_turn()
            end = next((i for i in range(start + 1, len(self.messages)) if self.messages[i]["role"] == "user"),
                       len(self.messages))
            del self.messages[start:end]
            dropped += 1
        return dropped

    def _first_turn(self) -> int | None:
        return next((i for i, m in enumerate(self.messages) if m["role"] == "user"), None)

    def _prompt_with(self, user_text: str) -> str:
        messages = [*self.messages, {"role": "user", "content": user_text}]
        if not self.variables:
            return self.llm.apply_chat_template(messages)
        return self.llm.prompt.apply_chat_template(messages, variables=self.variables)

    def _add_turn(self, user_text: str, reply_text: str) -> None:
        self.messages = [*self.messages, {"role": "user", "content": user_text},
                         {"role": "assistant", "content": reply_text}]


__all__ = ["ChatSession", "PromptCache", "Reply", "ReplyMarkup", "continuation_ids", "generate_reply", "reply_markup",
           "system_prefix"]
