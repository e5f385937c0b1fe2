"""The n-gram table Lookahead drafts from (MNN's speculative_decoding/ngram.hpp, its rules).

Every key of 1..max_len tokens seen in a text maps to the tokens that followed it. A draft is
grown one token at a time from the end of the sequence:
* "freqxlen": over all key lengths, the follower with the highest count x key length wins
  (the first one seen on a tie);
* "fcfs": the longest key that matches gives its first-seen follower.
Strictness "medium"/"high" also asks the winner to hold a share of its key's followers
(a percentage per key length); MNN applies it to the first draft token only.
"""

from __future__ import annotations

from collections import defaultdict

MAX_KEY_LEN = 8   # MNN's n-gram keys hold at most 8 tokens
# Least share (percent) of a key's followers the chosen one must have, by key length 1..8.
MIN_SHARE = {
    "medium": (60, 50, 50, 40, 40, 40, 40, 40),
    "high": (90, 80, 70, 60, 50, 50, 50, 50),
}


class NgramTable:
    def __init__(self, max_len: int, rule: str):
        self.max_len = max_len
        self.rule = rule
        # key -> {follower: count}; dicts keep first-seen order, which breaks ties and serves fcfs
        self.followers: dict[tuple[int, ...], dict[int, int]] = defaultdict(dict)

    def add(self, tokens: list[int], start: int = 0) -> None:
        """Index every token at position >= start as the follower of the keys before it."""
        for i in range(max(start, 1), len(tokens)):
            for size in range(1, min(self.max_len, i) + 1):
                counts = self.followers[tuple(tokens[i - size: i])]
                counts[tokens[i]] = counts.get(tokens[i], 0) + 1

    def draft(self, sequence: list[int], count: int, strictness: str = "low") -> list[int]:
        """Up to `count` tokens predicted to follow `sequence`; fewer where no key matches."""
        drafts: list[int] = []
        while len(drafts) < count:
            token = self._next(sequence + drafts, strictness if not drafts else "low")
            if token is None:
                break
            drafts.append(token)
        return drafts

    def _next(self, sequence: list[int], strictness: str) -> int | None:
        best, best_score = None, 0
        for size in range(min(self.max_len, len(sequence)), 0, -1):
            counts = self.followers.get(tuple(sequence[-size:]))
            if not counts:
                continue
            if self.rule == "fcfs":
                return next(iter(counts))
            token, top = max(counts.items(), key=lambda item: item[1])   # first seen among equals
            if top * size <= best_score:
                continue
            best, best_score = token, top * size
            if strictness != "low" and 100 * top < MIN_SHARE[strictness][size - 1] * sum(counts.values()):
                best = None   # as in MNN: a winner without the share leaves no draft at all
        return best
