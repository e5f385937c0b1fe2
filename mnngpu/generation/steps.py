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
