"""One choice of a request: its prompt prefilled (with every row's logits when echo asks for the
prompt's logprobs), its reply generated, and the pieces a stream sends.

A text prompt without echo logprobs goes through the server's PromptCache, so `reuse_kv` can
keep the KV cache between requests. A prompt of token ids, or one whose logprobs are echoed, is
prefilled from an empty cache as exactly those ids (GivenIds); the cache's text is then unknown,
so the next request starts clean.

A stream hears each piece of text once the stop strings let it out, with the log-probabilities
of the tokens whose text starts in it; the pieces' text and entries add up to the choice's. A
thinking model's chat reply (the request's reasoning plan) is split as it goes: a piece carries
its reasoning text and its answer text apart, and the choice its reasoning and answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mnngpu.apps.chat import PromptCache, generate_reply, system_prefix
from mnngpu.apps.server.logprobs import RequestSampler, TokenLogprob, prompt_logprobs, text_offsets
from mnngpu.apps.server.protocol import GenerationRequest, PromptInput, Usage
from mnngpu.apps.server.reasoning import Delta, ReasoningSplitter, ReasoningTokens
from mnngpu.apps.server.stop import StopMatcher


@dataclass
class Piece:
    """What a stream sends for one choice: text, the entries of the tokens it starts, or the end."""

    index: int
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    reasoning: str = ""   # a thinking reply's text from inside its block (`text` is then the answer's)


@dataclass
class Choice:
    index: int
    text: str
    finish_reason: str   # "stop", "length" or "cancelled" (the client went away, or the server stops)
    logprobs: list[TokenLogprob] | None   # None when none were asked for
    usage: Usage
    stop_string: str | None = None   # the stop string the reply ended at, if one
    reasoning: str | None = None   # a split reply's reasoning; None: not split, or no block
    answered: bool = True          # False: cut off inside its block (its answer, `text`, is then "")


class GivenIds(PromptCache):
    """A prompt whose ids are known: generate_reply prefills exactly `ids` after the `kept` tokens
    this request already put in the KV cache (none: the cache is cleared first)."""

    def __init__(self, shared: PromptCache, ids: list[int], kept: int):
        super().__init__(shared.llm)
        self.shared, self.ids, self.kept = shared, ids, kept

    @property
    def markup(self):
        return self.shared.markup

    def ids_for(self, prompt: str, prefix: str = "") -> list[int]:
        if not self.kept:
            self.clear()
        self.prefilled_now = self.kept   # prefilled by this request, so none of it counts as cached
        return list(self.ids)


@dataclass
class ChoiceRun:
    """Runs one choice on the worker thread; `on_piece` (when streaming) hears its pieces."""

    llm: object
    cache: PromptCache
    request: GenerationRequest
    sampler: RequestSampler
    show_special: bool
    should_stop: Callable[[], bool]
    on_piece: Callable[[Piece], None] | None = None
    stop_string: str | None = None   # set once a stop string ends the reply
    reasoning: ReasoningTokens | None = None   # a thinking reply's token counter (it holds the plan)

    def run(self, prompt: PromptInput, index: int) -> Choice:
        self.sampler.start_choice()
        cache, echo_text, echo_entries = self._prefill(prompt)
        if echo_text or echo_entries:
            self.send(Piece(index, echo_text, echo_entries))
        if self.request.max_tokens == 0:   # echo only
            text, finish, entries = "", "length", []
            usage = Usage(len(prompt) if isinstance(prompt, list) else len(self.llm.tokenizer_encode(prompt)), 0)
        else:
            text, finish, entries, usage = self._generate(prompt, cache, index, len(echo_text))
        self.send(Piece(index, finish_reason=finish))
        logprobs = echo_entries + entries if self._wants_logprobs else None
        if self.splitter is None:
            return Choice(index, echo_text + text, finish, logprobs, usage, self.stop_string)
        split, opened = self.split_text, self.splitter.opened
        return Choice(index, split.content, finish, logprobs, usage, self.stop_string,
                      split.reasoning if opened else None, not opened or self.splitter.closed)

    @property
    def _wants_logprobs(self) -> bool:
        return self.request.logprobs is not None

    def send(self, piece: Piece) -> None:
        if self.on_piece is not None:
            self.on_piece(piece)

    def _prefill(self, prompt: PromptInput) -> tuple[PromptCache, str, list[TokenLogprob]]:
        """The cache generate_reply runs with, the echoed text and the prompt's entries."""
        echo_logprobs = self.request.echo and self._wants_logprobs
        if isinstance(prompt, str) and not echo_logprobs:
            return self.cache, prompt if self.request.echo else "", []
        ids = list(prompt) if isinstance(prompt, list) else self.llm.tokenizer_encode(prompt)
        self.cache.clear()
        kept, entries = 0, []
        if echo_logprobs:
            kept = len(ids) - 1
            rows = self.llm.forward(ids[:-1], all_logits=True)[0] if kept else None
            entries = prompt_logprobs(rows, ids, self.request.logprobs)
        decoded, offsets = text_offsets(self.llm.tokenizer, ids)
        for entry, offset in zip(entries, offsets):
            entry.offset = offset
        echo_text = (prompt if isinstance(prompt, str) else decoded) if self.request.echo else ""
        return GivenIds(self.cache, ids[kept:], kept), echo_text, entries

    def __post_init__(self):
        self.splitter: ReasoningSplitter | None = None if self.reasoning is None else ReasoningSplitter(
            self.reasoning.thinking.markers, self.reasoning.inside)
        self.split_text = Delta()   # what the splitter let out so far, both parts

    def _split(self, text: str, last: bool = False) -> Delta:
        """`text` as reasoning and answer (all answer when the reply is not split)."""
        if self.splitter is None:
            return Delta(content=text)
        delta = self.splitter.feed(text)
        if last:
            end = self.splitter.finish()
            delta = Delta(delta.reasoning + end.reasoning, delta.content + end.content)
        self.split_text = Delta(self.split_text.reasoning + delta.reasoning, self.split_text.content + delta.content)
        return delta

    def _generate(self, prompt: PromptInput, cache: PromptCache, index: int,
                  base: int) -> tuple[str, str, list[TokenLogprob], Usage]:
        """The reply's text (cut at a stop string), finish reason, token entries and usage."""
        stops = StopMatcher(self.request.stop)
        recorded, stop_ids = self.sampler.recorded, cache.markup.stop_ids
        entries: list[TokenLogprob] = []
        emitted = [0, 0]   # characters generate_reply gave so far; entries sent so far

        def on_text(piece: str) -> bool:
            # each emitted token's text comes in one call, just after it was sampled; a stop id is
            # sampled but never emitted, and a last call after the reply has no token of its own
            if len(recorded) > len(entries) and recorded[len(entries)].token not in stop_ids:
                entries.append(recorded[len(entries)])
                entries[-1].offset = base + emitted[0]
            emitted[0] += len(piece)
            sendable = stops.feed(piece)
            if sendable:
                self._send_entries(index, sendable, entries, emitted, base + len(stops.text))
            return stops.hit or self.should_stop()

        text = prompt if isinstance(prompt, str) else ""
        prefix = system_prefix(self.llm, self.request.messages) if cache is self.cache else ""
        shown = frozenset() if self.reasoning is None else self.reasoning.thinking.special_ids
        reply = generate_reply(self.llm, cache, text, self.request.max_tokens, on_text,
                               show_special=self.show_special, prefix=prefix, shown_ids=shown)
        if cache is not self.cache:
            self.cache.text = cache.text if text else ""   # a text prompt's ids are its text's
        rest = stops.flush()
        kept = [e for e in entries if not stops.hit or e.offset < base + len(stops.text)]
        if rest or len(kept) > emitted[1] or self.splitter is not None:
            self._send_entries(index, rest, kept, emitted, float("inf"), last=True)
        finish = "stop" if stops.hit else reply.finish_reason
        self.stop_string = stops.matched
        thought = 0 if self.reasoning is None else self.reasoning.reasoning_tokens
        usage = Usage(reply.prompt_tokens, len(reply.token_ids), reply.cached_tokens, thought)
        return stops.text, finish, kept, usage

    def _send_entries(self, index: int, text: str, entries: list[TokenLogprob], emitted: list[int],
                      end: float, last: bool = False) -> None:
        """Send `text` (split, for a thinking reply) with the entries not sent yet whose text starts
        before `end`."""
        count = emitted[1]
        while count < len(entries) and entries[count].offset < end:
            count += 1
        delta = self._split(text, last)
        sent = entries[emitted[1]:count] if self._wants_logprobs else []
        if delta or sent or self.splitter is None:
            self.send(Piece(index, delta.content, sent, reasoning=delta.reasoning))
        emitted[1] = count
