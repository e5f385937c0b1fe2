"""Splitting added (special) tokens out of a text, as `tokenizers`' AddedVocabulary does.

The library finds the tokens leftmost-longest (Aho-Corasick); a regex alternation of the token
strings, longest first, finds the same ones: the leftmost position where any token starts, and
there the longest. Tokens with normalized=False are found in the raw text; each piece between
them is normalized on its own, then the normalized=True tokens (whose strings are normalized the
same way) are found in it. lstrip, rstrip and single_word are not done here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator


class TokenSplitter:
    """split(text): the pieces of text between the tokens, and each token's id, in order."""

    def __init__(self, tokens: dict[str, int]):
        self._ids = dict(tokens)
        strings = sorted(self._ids, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, strings))) if strings else None

    def split(self, text: str) -> list[str | int]:
        if self._pattern is None:
            return [text]
        pieces: list[str | int] = []
        last = 0
        for match in self._pattern.finditer(text):
            if match.start() > last:
                pieces.append(text[last:match.start()])
            pieces.append(self._ids[match.group()])
            last = match.end()
        if last < len(text):
            pieces.append(text[last:])
        return pieces


def splittable(added_tokens: list[dict]) -> bool:
    """Whether TokenSplitter finds these tokens exactly as the library does."""
    plain = all(t["content"] and not (t["lstrip"] or t["rstrip"] or t["single_word"]) for t in added_tokens)
    return plain and len({t["content"] for t in added_tokens}) == len(added_tokens)


def token_splitters(backend) -> tuple[TokenSplitter, TokenSplitter] | None:
    """The library tokenizer's added tokens as two splitters: those found in the raw text, and
    those found after normalizing (their strings normalized the same way). None where
    TokenSplitter would not find them as the library does."""
    added = [{"id": i, "content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip,
              "single_word": t.single_word, "normalized": t.normalized}
             for i, t in backend.get_added_tokens_decoder().items()]
    if not splittable(added):
        return None
    raw = {t["content"]: t["id"] for t in added if not t["normalized"]}
    normalizer = backend.normalizer
    normalized = {(normalizer.normalize_str(t["content"]) if normalizer else t["content"]): t["id"]
                  for t in added if t["normalized"]}
    if "" in normalized:
        return None
    return TokenSplitter(raw), TokenSplitter(normalized)


def split_out(text: str, raw_tokens: TokenSplitter, normalized_tokens: TokenSplitter,
              normalize: Callable[[str], str]) -> Iterator[int | str]:
    """In the library's order: the raw text's tokens, each piece between them normalized, then
    the normalized tokens found in it. Yields the tokens' ids and the normalized text between them."""
    for piece in raw_tokens.split(text):
        if isinstance(piece, int):
            yield piece
        else:
            yield from normalized_tokens.split(normalize(piece))
