"""tokenizer.txt type 3: a byte-level BPE (GPT-2 byte map): `<vocab> <merges>`, vocab lines, merges.

llmexport writes it from a slow tokenizer's vocab.json and merges.txt. The file keeps neither the
normalizer nor the split pattern; MNN 3.6.1's reader hard-codes Qwen's pattern with ASCII-only
letter classes, so it splits non-ASCII words apart. We use Qwen's pattern with Unicode classes
and NFC, as Qwen2's own tokenizer does.
"""

from __future__ import annotations

from pathlib import Path

from mnngpu.tokenizer import tokenizer_json as tj
from mnngpu.tokenizer.base import Tokenizer
from mnngpu.tokenizer.byte_level import chars_to_bytes
from mnngpu.tokenizer.header import TextBody, TokenizerHeader, text_body
from mnngpu.tokenizer.patterns import QWEN_PATTERN


def read_counts(body: TextBody) -> tuple[int, int]:
    line_number = body.line_number
    fields = body.next_line("'<vocab count> <merge count>'").split()
    try:
        vocab_count, merge_count = int(fields[0]), int(fields[1])
    except (ValueError, IndexError):
        raise body.error("expected '<vocab count> <merge count>'", line_number) from None
    return vocab_count, merge_count


def read_merges(body: TextBody, count: int, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The merge lines in rank order. Lines that are not a merge of two vocab tokens (merges.txt's
    '#version' line, which the exporter copies) are skipped, as MNN's reader never applies them."""
    merges = []
    for _ in range(count):
        left, _, right = body.next_line("a merge line 'a b'").partition(" ")
        if left in vocab and right in vocab and left + right in vocab:
            merges.append((left, right))
    return merges


def token_bytes(token: str, special: bool) -> bytes:
    data = chars_to_bytes(token)
    if data is not None:
        return data
    # A special token stored as plain text decodes to that text; MNN drops the unmapped characters.
    return token.encode("utf-8") if special else chars_to_bytes(token, skip_unmapped=True)


def load(path: Path, header: TokenizerHeader, data: bytes, body_offset: int) -> Tokenizer:
    body = text_body(path, data, body_offset)
    vocab_count, merge_count = read_counts(body)
    tokens = [body.next_line("a vocab line") for _ in range(vocab_count)]
    vocab: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        vocab.setdefault(token, token_id)
    merges = read_merges(body, merge_count, vocab)
    special_ids = sorted({i for i in header.special_ids if 0 <= i < len(tokens)})
    table = [token_bytes(t, i in special_ids) for i, t in enumerate(tokens)]
    added = [tj.added_token(i, table[i].decode("utf-8", errors="replace")) for i in special_ids]
    pre_tokenizer = tj.sequence("pre_tokenizer", [tj.split_regex(QWEN_PATTERN), tj.byte_level(False)])
    backend = tj.build(path, tj.bpe_model(vocab, merges), {"type": "NFC"}, pre_tokenizer, added)
    return Tokenizer(path, header, backend, table)
