"""tokenizer.txt type 1: a tiktoken vocabulary, one base64 token per line, the id being the rank.

The only producer llmexport knows is a tiktoken tokenizer (Qwen 1), whose ids come from
tiktoken's BPE: Qwen's split pattern, then merges by rank. MNN 3.6.1's reader instead takes the
longest vocab match at each byte, which differs from tiktoken on ordinary text (runs of spaces,
words whose best merge is not the longest prefix), so we follow tiktoken.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from mnngpu.tokenizer import tokenizer_json as tj
from mnngpu.tokenizer.base import Tokenizer
from mnngpu.tokenizer.byte_level import bytes_to_chars
from mnngpu.tokenizer.header import TextBody, TokenizerHeader, text_body
from mnngpu.tokenizer.patterns import QWEN_PATTERN
from mnngpu.tokenizer.ranked_merges import merges_from_ranked_tokens


def read_tokens(body: TextBody) -> list[bytes]:
    count = body.next_int("the vocab count")
    tokens = []
    for _ in range(count):
        line_number = body.line_number
        line = body.next_line("a base64 token line")
        try:
            tokens.append(base64.b64decode(line.strip(), validate=True))
        except (binascii.Error, ValueError):  # ValueError: a non-ASCII character in the line
            raise body.error(f"expected one base64 token, found {line[:60]!r}", line_number) from None
    return tokens


def load(path: Path, header: TokenizerHeader, data: bytes, body_offset: int) -> Tokenizer:
    tokens = read_tokens(text_body(path, data, body_offset))
    specials = {i for i in header.special_ids if 0 <= i < len(tokens)}
    vocab: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        if token_id not in specials:
            vocab.setdefault(bytes_to_chars(token), token_id)
    ranked = sorted(vocab, key=vocab.get)
    merges = merges_from_ranked_tokens((t for t in ranked if len(t) > 1), set(vocab))
    added = [tj.added_token(i, tokens[i].decode("utf-8", errors="replace")) for i in sorted(specials)]
    pre_tokenizer = tj.sequence("pre_tokenizer", [tj.split_regex(QWEN_PATTERN), tj.byte_level(False)])
    backend = tj.build(path, tj.bpe_model(vocab, merges), None, pre_tokenizer, added)
    return Tokenizer(path, header, backend, tokens)
