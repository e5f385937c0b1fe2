"""Autoregressive generation: one token per forward, over any forward() callable.

Kept apart from Llm so other strategies (lookahead, mtp, eagle) can sit beside it with the
same signature.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def generate(forward: Callable[[list[int]], np.ndarray], sample: Callable[[np.ndarray], int],
             is_stop: Callable[[int], bool], prompt_ids: list[int], max_new_tokens: int,
             on_token: Callable[[int], bool | None] | None = None) -> list[int]:
    """Prefill `prompt_ids`, then decode until a stop id or `max_new_tokens` new tokens.

    `forward(ids)` returns the last position's logits [vocab]. `on_token(id)` sees each new
    token as it comes; returning True stops generation (e.g. a client went away).
    The stop id itself is not returned.
    """
    out: list[int] = []
    if max_new_tokens <= 0:
        return out
    logits = forward(prompt_ids)
    while True:
        token = sample(logits)
        if is_stop(token):
            break
        out.append(token)
        if (on_token is not None and on_token(token)) or len(out) >= max_new_tokens:
            break
        logits = forward([token])
    return out
