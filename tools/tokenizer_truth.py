"""The independent truth for each tokenizer fixture: the library the source tokenizer was made with.

A fixture's reference.json names its source under "source":
  sentencepiece  {"model": file, "prefix_ids": [...], "special_tokens": {text: id}}
  tiktoken       {"ranks": file, "pattern": regex, "special_tokens": {text: id}}
  transformers   {"dir": folder}   (AutoTokenizer on the slow-format files the exporter read)
  tokenizers     {"file": tokenizer.json}

Every truth encodes without the library's post-processor and puts the file's prefix ids first, as
MNN does. SentencePiece and tiktoken get the special tokens split out first (as MNN and HF's
tokenizers do); each piece of text between them then goes to the library on its own.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path

Encoder = Callable[[str], list[int]]


def _split_specials(text: str, specials: dict[str, int]) -> list[str | int]:
    if not specials:
        return [text]
    pattern = "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True))
    parts: list[str | int] = []
    last = 0
    for match in re.finditer(pattern, text):
        if match.start() > last:
            parts.append(text[last:match.start()])
        parts.append(specials[match.group()])
        last = match.end()
    if last < len(text):
        parts.append(text[last:])
    return parts


def _with_specials(encode_text: Encoder, specials: dict[str, int], prefix: list[int]) -> Encoder:
    def encode(text: str) -> list[int]:
        ids = list(prefix)
        for part in _split_specials(text, specials):
            ids.extend([part] if isinstance(part, int) else encode_text(part))
        return ids
    return encode


def sentencepiece_encoder(folder: Path, source: dict) -> Encoder:
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / source["model"]))
    return _with_specials(processor.encode, source["special_tokens"], source["prefix_ids"])


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def tiktoken_encoder(folder: Path, source: dict) -> Encoder:
    import tiktoken

    encoding = tiktoken.Encoding(name="fixture", pat_str=source["pattern"],
                                 mergeable_ranks=read_tiktoken_ranks(folder / source["ranks"]),
                                 special_tokens=source["special_tokens"])
    return lambda text: encoding.encode(text, allowed_special="all")


def transformers_encoder(folder: Path, source: dict) -> Encoder:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder / source["dir"]))
    prefix = source.get("prefix_ids", [])
    return lambda text: prefix + tokenizer.encode(text, add_special_tokens=False)


def tokenizers_encoder(folder: Path, source: dict) -> Encoder:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / source["file"]))
    prefix = source.get("prefix_ids", [])
    return lambda text: prefix + tokenizer.encode(text, add_special_tokens=False).ids


ENCODERS = {"sentencepiece": sentencepiece_encoder, "tiktoken": tiktoken_encoder,
            "transformers": transformers_encoder, "tokenizers": tokenizers_encoder}

SOURCE_MODULES = {"sentencepiece": "sentencepiece", "tiktoken": "tiktoken",
                  "transformers": "transformers", "tokenizers": "tokenizers"}


def source_encoder(folder: Path, source: dict) -> Encoder:
    """The truth encoder for the fixture in `folder`, from its reference.json "source" entry."""
    return ENCODERS[source["library"]](Path(folder), source)
