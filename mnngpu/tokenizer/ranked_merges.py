"""BPE merge lists for vocabularies that rank tokens instead of listing merges.

SentencePiece BPE (by piece score) and tiktoken (by rank) both merge, at each step, the adjacent
pair whose concatenation ranks best, the leftmost on a tie. HuggingFace's BPE merges the adjacent
pair whose *merge* ranks best, the leftmost on a tie. Listing, for every token in rank order,
each way to split it into two tokens gives the BPE model the same choices in the same order.
"""

from __future__ import annotations

from typing import Iterable


def merges_from_ranked_tokens(ranked: Iterable[str], symbols: set[str]) -> list[tuple[str, str]]:
    """Merges for the multi-character tokens in `ranked` (best first); `symbols` holds every string
    that can stand as one symbol during BPE (the single characters and the mergeable tokens)."""
    merges = []
    for token in ranked:
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in symbols and right in symbols:
                merges.append((left, right))
    return merges
