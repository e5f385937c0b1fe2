"""Log-probabilities for the server's replies, and the sampler one request runs.

A token's log-probability is the log-softmax of the model's full logits at its position, taken
before any sampler step (logit_bias, penalties, temperature, top-p ...), so it is the model's own
number. The prompt's tokens get theirs from one forward with every row's logits (echo); the
first prompt token has none (null), since nothing comes before it.

    RequestSampler   OpenAI's logit_bias and penalties, and the request's grammar (structured.py),
                     in front of the model's sampler; records each sampled token's
                     log-probability when the request asks for them
    chat_logprobs    {"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}
    legacy_logprobs  {tokens, token_logprobs, top_logprobs, text_offset} (completions)

With no log-probabilities asked for, nothing here reads the whole vocabulary.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mnngpu.apps.server.structured import Grammar
from mnngpu.sampler import Sampler, openai_adjusted


@dataclass
class TokenLogprob:
    token: int
    logprob: float | None          # None for the prompt's first token
    top: list[tuple[int, float]]   # the most likely tokens at this position, most likely first
    offset: int = 0                # where the token's text starts in the choice's text


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax(logits) over the whole row, summed in float64."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    shifted = row - row.max()
    return shifted - np.log(np.exp(shifted).sum())


def most_likely(logprobs: np.ndarray, count: int) -> list[tuple[int, float]]:
    """The `count` most likely (token, logprob), most likely first; ties: the lower id first."""
    if count <= 0:
        return []
    chosen = np.argpartition(-logprobs, count - 1)[:count] if count < logprobs.size else np.arange(logprobs.size)
    order = np.lexsort((chosen, -logprobs[chosen]))
    return [(int(t), float(logprobs[t])) for t in chosen[order]]


def position_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    logprobs = log_softmax(logits)
    return TokenLogprob(int(token), float(logprobs[token]), most_likely(logprobs, top))


def prompt_logprobs(rows: np.ndarray, ids: Sequence[int], top: int) -> list[TokenLogprob]:
    """Each prompt token's entry: `rows[i]` are the logits after ids[: i + 1] (all_logits), so they
    score ids[i + 1]; the first token has none."""
    entries = [TokenLogprob(int(ids[0]), None, [])]
    entries += [position_logprob(rows[i], ids[i + 1], top) for i in range(len(ids) - 1)]
    return entries


class RequestSampler:
    """What Llm.generate samples with for one request: OpenAI's logit_bias, presence_penalty and
    frequency_penalty (mnngpu.sampler.openai_adjusted) applied, the tokens the request's grammar
    forbids masked, then the model's sampler. With `top` not None, each sampled token's
    log-probability and `top` alternatives are kept in `recorded`, from the logits before any
    adjustment. start_choice() begins a new reply; the random stream goes on, so n choices of one
    seeded request differ and repeat. All of a reply's state is here, so each sequence of a batch
    is constrained by its own sampler."""

    def __init__(self, sampler: Sampler, logit_bias: dict[int, float], presence: float, frequency: float,
                 top: int | None, grammar: Grammar | None = None):
        self.sampler = sampler
        self.logit_bias, self.presence, self.frequency, self.top = logit_bias, presence, frequency, top
        self.grammar = grammar
        self.start_choice()

    def start_choice(self) -> None:
        self.generated: Counter[int] = Counter()
        self.recorded: list[TokenLogprob] = []
        if self.grammar is not None:
            self.grammar.reset()

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        if self.grammar is not None and self.grammar.finished:
            token = self.grammar.end_token   # the grammar is complete: nothing but the end may follow
        else:
            token = self._sample(logits, history)
        if self.top is not None:
            self.recorded.append(position_logprob(logits, token, self.top))
        self.generated[token] += 1
        return token

    def _sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        adjusted = logits
        if self.logit_bias or self.presence or self.frequency:
            adjusted = openai_adjusted(logits, self.logit_bias, self.generated, self.presence, self.frequency)
        if self.grammar is None:
            return int(self.sampler.sample(adjusted, history))
        adjusted = self.grammar.mask(adjusted)
        token = int(self.sampler.sample(adjusted, history))
        if not self.grammar.allows(token):
            # a sampler step's float rounding can land on a masked candidate: take the likeliest allowed one
            token = int(np.argmax(adjusted))
        self.grammar.advance(token)
        return token


def chat_logprobs(entries: Sequence[TokenLogprob], tokenizer) -> dict:
    """OpenAI's chat `logprobs` object."""

    def item(token: int, logprob: float) -> dict:
        return {"token": tokenizer.decode(token), "logprob": logprob, "bytes": list(tokenizer.token_bytes(token))}

    content = [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries]
    return {"content": content, "refusal": None}


def legacy_logprobs(entries: Sequence[TokenLogprob], tokenizer) -> dict:
    """The completions endpoint's `logprobs` object. As in OpenAI's, a token's alternatives
    include the token itself (so up to logprobs + 1 of them); the first prompt token's are null,
    and a token whose bytes are not whole UTF-8 text is written "bytes:\\xe2\\x80"."""
    top = []
    for e in entries:
        if e.logprob is None:
            top.append(None)
            continue
        alternatives = {legacy_token(tokenizer, t): lp for t, lp in e.top}
        alternatives.setdefault(legacy_token(tokenizer, e.token), e.logprob)
        top.append(alternatives)
    return {"tokens": [legacy_token(tokenizer, e.token) for e in entries],
            "token_logprobs": [e.logprob for e in entries], "top_logprobs": top,
            "text_offset": [e.offset for e in entries]}


def legacy_token(tokenizer, token: int) -> str:
    data = tokenizer.token_bytes(token)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in data)


def text_offsets(tokenizer, ids: Sequence[int]) -> tuple[str, list[int]]:
    """The text of `ids` decoded as a stream, and where each id's text starts in it."""
    decoder = tokenizer.stream_decoder()
    text, offsets = "", []
    for token in ids:
        offsets.append(len(text))
        text += decoder.feed(token)
    return text + decoder.flush(), offsets
