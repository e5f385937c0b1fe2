"""Thinking models: where a reply's reasoning (its `<think>` block) ends and its answer begins.

A model thinks when its chat template writes a think block (Qwen3, Qwen3.5, DeepSeek-R1 distills:
`<think>` ... `</think>`; another tag with "think" in its name works the same) and its tokenizer
can write the markers, as added tokens or as plain text. Nothing here looks at the model's name.

    thinking = detect_thinking(llm.prompt, llm.tokenizer)   # None: the model does not think
    thinking.switch                                         # "enable_thinking", or None: cannot be switched
    inside = thinking.opens_block(prompt_text)              # the prompt itself ended inside <think>

    splitter = ReasoningSplitter(thinking.markers, inside)  # a stream, piece by piece
    for piece in pieces:
        delta = splitter.feed(piece)                        # Delta(reasoning="...", content="...")
    delta = splitter.finish()                               # whatever was held back
    split = split_reasoning(text, thinking.markers, inside) # the whole text at once: Split(reasoning, content)

    counter = ReasoningTokens(thinking, tokenizer, inside, budget=-1)   # fed the sampled token ids
    sampler = BudgetSampler(request_sampler, counter, stop_ids)         # closes the block after `budget`
    counter.reasoning_tokens                                            # usage's reasoning_tokens

A chat request's side (the server's engine does this for every chat reply; a Choice then carries
`reasoning` and `answered` beside its `text`, the answer):

    variables = template_variables(thinking, request)   # chat_template_kwargs, reasoning_effort, grammar
    prompt = llm.prompt.apply_chat_template(messages, variables=variables)
    plan = reasoning_plan(thinking, prompt, request, "auto", default_budget=-1)   # None: not split

The rules, the same streamed or whole: a block counts only at the very start of the reply
(whitespace before it aside), or from the first token when the prompt opened it. The reasoning is
the text between the markers, whitespace trimmed on both sides; the answer is the text after the
end marker, its leading whitespace trimmed. A reply without a block is all answer, as written. A
reply cut off inside the block keeps its text as reasoning and has no answer (None), as vLLM's
DeepSeek-R1 parser and llama-server give it. The splitter holds back only what may still turn out
to be a marker, or whitespace that the trimming may drop.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

SWITCH = "enable_thinking"   # the template variable Qwen3's and MNN's templates read
_TAG = re.compile(r"<([\w:|.-]*think[\w:|.-]*)>", re.IGNORECASE)
_PROBE = [{"role": "user", "content": "\x00probe\x00"}]


@dataclass(frozen=True)
class ThinkMarkers:
    start: str = "<think>"
    end: str = "</think>"


@dataclass(frozen=True)
class Thinking:
    """What a thinking model's template and tokenizer say: the markers, the variable that
    switches thinking (None: it cannot be switched), whether it is on when nobody sets it,
    the end marker's token ids (what a budget forces), and the marker tokens that are special
    (a reply shows their text all the same)."""

    markers: ThinkMarkers
    switch: str | None
    on_by_default: bool
    end_ids: tuple[int, ...]
    special_ids: frozenset[int]

    def opens_block(self, prompt: str) -> bool:
        """Whether the prompt ends inside an open block (the template opened it for the reply)."""
        return prompt.rstrip().endswith(self.markers.start)


def detect_thinking(prompt, tokenizer) -> Thinking | None:
    """The model's Thinking, from its chat template (a mnngpu.prompt.Prompt) and tokenizer; None
    when the template writes no think block or the tokenizer cannot write its markers."""
    source = prompt.template_source or ""
    rendered = {value: _render(prompt, {SWITCH: value}) for value in (True, False, None)}
    markers = _markers_in(source) or _markers_in("".join(r or "" for r in rendered.values()))
    if markers is None or not all(_writes(tokenizer, text) for text in (markers.start, markers.end)):
        return None
    switch = SWITCH if rendered[True] is not None and rendered[True] != rendered[False] else None
    on_by_default = switch is None or rendered[None] == rendered[True]
    special = frozenset(i for i in tokenizer.special_ids if tokenizer.decode(i) in (markers.start, markers.end))
    return Thinking(markers, switch, on_by_default, tuple(_ids(tokenizer, markers.end)), special)


def _markers_in(text: str) -> ThinkMarkers | None:
    for match in _TAG.finditer(text):
        tag = match.group(1)
        if f"</{tag}>" in text:
            return ThinkMarkers(f"<{tag}>", f"</{tag}>")
    return None


def _render(prompt, variables: dict) -> str | None:
    from mnngpu.errors import MnnGpuError

    if not prompt.template_source:
        return None
    try:
        return prompt.render(_PROBE, True, variables={k: v for k, v in variables.items() if v is not None})
    except MnnGpuError:
        return None


def _ids(tokenizer, text: str) -> list[int]:
    """`text`'s ids as it continues a sequence (no BOS)."""
    return tokenizer.encode(text)[len(tokenizer.prefix_ids):]


def _writes(tokenizer, text: str) -> bool:
    """Whether the tokenizer's ids for `text` decode to exactly `text`."""
    data = b"".join(tokenizer.token_bytes(i) for i in _ids(tokenizer, text))
    return data.decode("utf-8", "replace") == text


# ---- the split -------------------------------------------------------------------------------------


@dataclass
class Delta:
    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


@dataclass(frozen=True)
class Split:
    reasoning: str | None   # None: the reply has no block
    content: str | None     # None: the reply was cut off inside its block


BEFORE, INSIDE, AFTER, PLAIN = "before", "inside", "after", "plain"   # PLAIN: no block at all


class ReasoningSplitter:
    """Splits a reply's text, fed piece by piece, into reasoning and answer (the module's rules)."""

    def __init__(self, markers: ThinkMarkers, inside: bool = False):
        self.markers = markers
        self.state = INSIDE if inside else BEFORE
        self.held = ""
        self.reasoning_started = False   # a non-blank reasoning character was let out
        self.content_started = False     # after the block: a non-blank answer character was let out

    @property
    def opened(self) -> bool:
        return self.state in (INSIDE, AFTER)

    @property
    def closed(self) -> bool:
        return self.state == AFTER

    def feed(self, text: str) -> Delta:
        self.held += text
        delta = Delta()
        if self.state == BEFORE:
            self._before()
        if self.state == INSIDE:
            self._inside(delta)
        if self.state == AFTER:
            delta.content += self._after()
        if self.state == PLAIN:
            delta.content += self.held
            self.held = ""
        return delta

    def finish(self) -> Delta:
        """What is still held once the reply has ended."""
        held, self.held = self.held, ""
        if self.state == INSIDE:
            return Delta(reasoning=self._reasoning_text(held.rstrip()))
        return Delta(content=held)   # after the block nothing is held; before it, no block came

    def _before(self) -> None:
        start = self.markers.start
        text = self.held.lstrip()
        if text.startswith(start):
            self.state, self.held = INSIDE, text[len(start):]
        elif text and not start.startswith(text):
            self.state = PLAIN

    def _inside(self, delta: Delta) -> None:
        end = self.markers.end
        found = self.held.find(end)
        if found >= 0:
            delta.reasoning += self._reasoning_text(self.held[:found].rstrip())
            self.state, self.held = AFTER, self.held[found + len(end):]
            return
        keep = _partial_suffix(self.held, end)
        ready = self.held[:len(self.held) - keep].rstrip()
        delta.reasoning += self._reasoning_text(ready)
        self.held = self.held[len(ready):]

    def _reasoning_text(self, text: str) -> str:
        if not self.reasoning_started:
            text = text.lstrip()
            self.reasoning_started = bool(text)
        return text

    def _after(self) -> str:
        if not self.content_started:
            self.held = self.held.lstrip()
            self.content_started = bool(self.held)
        text, self.held = self.held, ""
        return text


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that `marker` starts with."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def split_reasoning(text: str, markers: ThinkMarkers, inside: bool = False) -> Split:
    """The whole reply's split: the same as feeding it to a ReasoningSplitter in one piece."""
    splitter = ReasoningSplitter(markers, inside)
    delta = splitter.feed(text)
    last = splitter.finish()
    reasoning, content = delta.reasoning + last.reasoning, delta.content + last.content
    if not splitter.opened:
        return Split(None, content)
    return Split(reasoning, content if splitter.closed else None)


# ---- the reply's tokens: how many were reasoning, and the budget --------------------------------------


class ReasoningTokens:
    """Follows a reply token by token: how many of its tokens belong to its block (the markers
    included; a block the prompt opened counts from the first token), and, with a `budget` >= 0,
    the ids to force once the block has run `budget` tokens past its opening (the end marker)."""

    def __init__(self, thinking: Thinking, tokenizer, inside: bool, budget: int = -1):
        self.thinking, self.tokenizer, self.inside, self.budget = thinking, tokenizer, inside, budget
        self.splitter = ReasoningSplitter(thinking.markers, inside)
        self.decoder = tokenizer.stream_decoder()
        self.tokens = 0            # the reply's tokens so far
        self.thought = 0           # tokens since the block opened, while it is open
        self.closed_at: int | None = None
        self.forcing: list[int] = []

    @property
    def reasoning_tokens(self) -> int:
        if self.closed_at is not None:
            return self.closed_at
        return self.tokens if self.splitter.opened else 0

    def observe(self, token: int) -> None:
        was_open = self.splitter.state == INSIDE
        self.tokens += 1
        if self.tokenizer.is_special(token):
            text = self.decoder.flush() + self.tokenizer.decode(token)
        else:
            text = self.decoder.feed(token)
        self.splitter.feed(text)
        if was_open and self.splitter.state == INSIDE:
            self.thought += 1
        if self.splitter.closed and self.closed_at is None:
            self.closed_at = self.tokens
            self.forcing = []

    def forced_token(self) -> int | None:
        """The id the next token must be (the end marker, once the budget is spent), or None."""
        if (self.budget >= 0 and not self.forcing and self.splitter.state == INSIDE and self.thought >= self.budget
                and self.closed_at is None):
            self.forcing = list(self.thinking.end_ids)
        return self.forcing.pop(0) if self.forcing else None


class BudgetSampler:
    """A request's sampler that reports every sampled token to a ReasoningTokens, and samples
    the token it forces from logits in which only that token is possible (so penalties, the
    log-probabilities recorded and the sampler's state all see it; its logprob is 0)."""

    def __init__(self, sampler, counter: ReasoningTokens, stop_ids: Collection[int]):
        self.sampler, self.counter, self.stop_ids = sampler, counter, stop_ids

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        forced = self.counter.forced_token()
        if forced is not None:
            only = np.full_like(logits, -1e9)
            only.reshape(-1)[forced] = 0.0
            logits = only
        token = int(self.sampler.sample(logits, history))
        if token not in self.stop_ids:
            self.counter.observe(token)
        return token


# ---- a chat request's switches ------------------------------------------------------------------------

REASONING_FORMATS = ("auto", "none")   # serve --reasoning-format: split where detected, or never
_OFF_EFFORTS = ("none", "minimal")


@dataclass(frozen=True)
class ReasoningPlan:
    """How one reply is split and bounded: the model's Thinking, whether the prompt opened the
    block, and the budget (-1: none)."""

    thinking: Thinking
    inside: bool
    budget: int = -1

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.thinking.markers, self.inside)

    def counter(self, tokenizer) -> ReasoningTokens:
        return ReasoningTokens(self.thinking, tokenizer, self.inside, self.budget)


def template_variables(thinking: Thinking | None, request) -> dict:
    """The variables a chat request gives its template: its chat_template_kwargs, with
    reasoning_effort as enable_thinking, and thinking off under a grammar (response_format, a
    required tool call), which shapes the whole reply. A request the model cannot honour is an
    ApiError naming the field."""
    from mnngpu.apps.server.protocol import ApiError

    variables = dict(request.template_kwargs)
    effort = request.reasoning_effort
    if thinking is None:
        for name, value in (("reasoning_effort", effort), ("thinking_budget_tokens", request.thinking_budget)):
            if value is not None and value != -1:
                raise ApiError(400, f"this model does not think (its chat template writes no think block), so "
                                    f"'{name}' cannot be honoured; leave it out", param=name)
        return variables
    switch = thinking.switch
    wanted = None if effort is None else effort not in _OFF_EFFORTS
    if wanted is not None:
        if switch is None and not wanted:
            raise ApiError(400, f"this model's chat template cannot switch thinking off (it reads no {SWITCH}); "
                                "it thinks on every reply: leave reasoning_effort out, or use low, medium or high",
                           param="reasoning_effort")
        if switch is not None and variables.get(switch, wanted) != wanted:
            raise ApiError(400, f"reasoning_effort {effort!r} contradicts chat_template_kwargs.{switch}",
                           param="reasoning_effort")
        if switch is not None:
            variables[switch] = wanted
    if request.grammar is not None:
        if (switch is not None and variables.get(switch) is True) or wanted:
            raise ApiError(400, "a response_format or a required tool call shapes the whole reply, so the model "
                                "cannot think first; leave thinking off for it", param="reasoning_effort"
                           if wanted else f"chat_template_kwargs.{switch}")
        if switch is not None:
            variables[switch] = False
    return variables


def reasoning_plan(thinking: Thinking | None, prompt: str, request, reasoning_format: str,
                   default_budget: int) -> ReasoningPlan | None:
    """The plan of a chat reply to `prompt` (rendered with template_variables), or None when it
    is not split: the model does not think, --reasoning-format none, or a grammar shapes it."""
    from mnngpu.apps.server.protocol import ApiError

    if thinking is None:
        return None
    inside = thinking.opens_block(prompt)
    if request.grammar is not None:
        if inside:
            raise ApiError(400, "this model's chat template opens a think block for every reply and cannot "
                                "switch it off, so a response_format or a required tool call cannot shape its reply",
                           param="response_format" if request.tools is None or request.tools.in_prompt is None
                           else "tool_choice")
        return None
    if reasoning_format == "none":
        return None
    budget = default_budget if request.thinking_budget is None else request.thinking_budget
    return ReasoningPlan(thinking, inside, budget)
