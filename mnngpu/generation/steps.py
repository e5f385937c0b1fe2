"""What a generation strategy drives: the Llm's forward calls, its sampler, and the output.

A strategy sees the model only through DecodeSteps, so it can be tested on any forward and
sampler; `Output` applies the rules every strategy shares for when a reply ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class DecodeSteps:
    forward: Callable[[list[int]], np.ndarray]   # ids -> the last position's logits [vocab]
    sample: Callable[[np.ndarray], int]          # logits -> a token, appended to `history`
    is_stop: Callable[[int], bool]
    history: list[int]                           # every token so far: earlier turns, prompt, sampled
    on_token: Callable[[int], bool | None] | None = None
    verify: Callable[[list[int]], np.ndarray] | None = None   # ids -> logits [len(ids), vocab], one forward
    discard: Callable[[int], None] | None = None   # keep only the first n ids of the last verify in the cache
    fits: Callable[[int], bool] = lambda count: True   # whether n more ids fit in the cache's limit
    tokenizer: object | None = None   # encode()/decode(), for strategies that read text
    hidden: Callable[[], np.ndarray] | None = None   # the last forward's or verify's hidden_states [ids, width]


@dataclass
class GenerationStats:
    """Counts of one generate() call, for the bench table and `mnngpu run`."""

    decode_forwards: int = 0   # forwards after the prefill (a verify block is one)
    decode_tokens: int = 0     # tokens those forwards produced
    drafted: int = 0           # draft slots verified (draft_predict_length per verify forward)
    accepted: int = 0          # draft slots the model agreed with

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.decode_tokens / self.decode_forwards if self.decode_forwards else 0.0


@dataclass
class Output:
    """The reply so far. `take(token)` adds a sampled token and says whether the reply ends:
    on a stop id (not kept), on `on_token` returning True, or at `limit` tokens."""

    steps: DecodeSteps
    limit: int
    tokens: list[int] = field(default_factory=list)
    ended_on_stop_id: bool = False

    def take(self, token: int) -> bool:
        if self.steps.is_stop(token):
            self.ended_on_stop_id = True
            return True
        self.tokens.append(token)
        on_token = self.steps.on_token
        stop = bool(on_token(token)) if on_token is not None else False
        return stop or len(self.tokens) >= self.limit


PAD_ID = 0   # fills a verify block up to the verify module's fixed size


def verify_block(steps: DecodeSteps, out: Output, block: list[int], verify_length: int) -> tuple[bool, int]:
    """One verify forward of `block` ([current token, drafts...]) padded with PAD_ID to
    verify_length. The rows are sampled in order: row r's token is exactly what AR would sample
    after the first r+1 ids, so while it equals block id r+1 the next row is valid too (a pad
    included: it was fed). The cache keeps the rows up to the last one sampled. Returns whether
    the reply ended and how many rows the cache keeps."""
    block = block + [PAD_ID] * (verify_length - len(block))
    rows = steps.verify(block)
    for row in range(verify_length):
        token = steps.sample(rows[row])
        ended = out.take(token)
        if ended or row + 1 == verify_length or token != block[row + 1]:
            break
    steps.discard(row + 1)
    return ended, row + 1
