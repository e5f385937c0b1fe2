"""tokenizer.txt type 0: a SentencePiece BPE model, one `base64(piece) score type` line per id.

The truth is `sentencepiece` on the source tokenizer.model. MNN 3.6.1's reader disagrees on files
from llmexport 0.0.5: the exporter writes the piece marker "▁" as a plain space, which the reader
never maps back, so every space of the input falls to byte-fallback tokens. We map it back.

The file keeps no normalizer spec. We encode as a Llama-style model does (and as MNN does): spaces
become "▁", one "▁" goes in front, no other normalization, unknown characters fall back to bytes.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from pathlib import Path

from mnngpu.tokenizer import tokenizer_json as tj
from mnngpu.tokenizer.base import Tokenizer
from mnngpu.tokenizer.header import TextBody, TokenizerHeader, text_body
from mnngpu.tokenizer.ranked_merges import merges_from_ranked_tokens

MARKER = "\u2581"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass
class Piece:
    text: str       # with "▁" for a space, as in the source model
    score: float
    kind: int


def read_pieces(body: TextBody) -> list[Piece]:
    count = body.next_int("the vocab count")
    pieces = []
    for _ in range(count):
        line_number = body.line_number
        fields = body.next_line("a piece line 'base64 score type'").split(" ")
        if len(fields) < 3:
            raise body.error("expected 'base64(piece) score type'", line_number)
        try:
            text = base64.b64decode(fields[0], validate=True).decode("utf-8")
            pieces.append(Piece(text.replace(" ", MARKER), float(fields[1]), int(fields[2])))
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise body.error(f"expected 'base64(piece) score type', found {' '.join(fields)[:60]!r}",
                             line_number) from None
    return pieces


def piece_bytes(piece: Piece) -> bytes:
    if piece.kind == BYTE and (match := BYTE_PIECE.fullmatch(piece.text)):
        return bytes([int(match.group(1), 16)])
    return piece.text.replace(MARKER, " ").encode("utf-8")


def bpe_merges(pieces: list[Piece], vocab: dict[str, int]) -> list[tuple[str, str]]:
    normal = [p for p in pieces if p.kind == NORMAL]
    symbols = {p.text for p in normal} | {text for text in vocab if len(text) == 1}
    ranked = sorted((p for p in normal if len(p.text) > 1), key=lambda p: -p.score)
    return merges_from_ranked_tokens((p.text for p in ranked), symbols)


def word_splitter(pieces: list[Piece]) -> dict | None:
    """Split before each run of "▁" when no piece holds a "▁" after another character: then no
    merge can cross such a point, the ids are the same, and each word is cached and merged alone."""
    if any(re.search(f"[^{MARKER}]{MARKER}", p.text) for p in pieces if p.kind == NORMAL):
        return None
    return tj.split_regex(f"{MARKER}*[^{MARKER}]+|{MARKER}+")


def load(path: Path, header: TokenizerHeader, data: bytes, body_offset: int) -> Tokenizer:
    pieces = read_pieces(text_body(path, data, body_offset))
    vocab: dict[str, int] = {}
    for token_id, piece in enumerate(pieces):
        vocab.setdefault(piece.text, token_id)
    has_bytes = any(p.kind == BYTE for p in pieces)
    unk = next((p.text for p in pieces if p.kind == UNKNOWN), None)
    specials = [tj.added_token(i, pieces[i].text) for i in header.special_ids if 0 <= i < len(pieces)]
    model = tj.bpe_model(vocab, bpe_merges(pieces, vocab), byte_fallback=has_bytes, unk_token=unk,
                         fuse_unk=not has_bytes)
    normalizer = tj.sequence("normalizer", [
        {"type": "Prepend", "prepend": MARKER},
        {"type": "Replace", "pattern": {"String": " "}, "content": MARKER}])
    backend = tj.build(path, model, normalizer, word_splitter(pieces), specials)
    return Tokenizer(path, header, backend, [piece_bytes(p) for p in pieces])
