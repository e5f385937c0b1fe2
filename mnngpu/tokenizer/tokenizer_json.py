"""Pieces of a HuggingFace tokenizer.json, and the `tokenizers.Tokenizer` made from them.

Every MNN format is translated into the tokenizer.json that computes the same ids, so the
encoding itself runs in HuggingFace's `tokenizers` (Rust). Building from JSON, not from the Python
constructors, keeps every id exactly where the MNN file puts it (added tokens included).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HfTokenizer

from mnngpu.errors import TokenizerError

Part = dict | None


def added_token(token_id: int, content: str, special: bool = True, lstrip: bool = False,
                rstrip: bool = False, normalized: bool | None = None) -> dict:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def bpe_model(vocab: dict[str, int], merges: list[tuple[str, str]], byte_fallback: bool = False,
              unk_token: str | None = None, fuse_unk: bool = False) -> dict:
    return {"type": "BPE", "dropout": None, "unk_token": unk_token, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": fuse_unk, "byte_fallback": byte_fallback,
            "ignore_merges": False, "vocab": vocab, "merges": [list(m) for m in merges]}


def wordpiece_model(vocab: dict[str, int], unk_token: str, prefix: str = "##", max_chars: int = 100) -> dict:
    return {"type": "WordPiece", "unk_token": unk_token, "continuing_subword_prefix": prefix,
            "max_input_chars_per_word": max_chars, "vocab": vocab}


def unigram_model(pieces: list[tuple[str, float]], unk_id: int | None, byte_fallback: bool) -> dict:
    return {"type": "Unigram", "unk_id": unk_id, "vocab": [list(p) for p in pieces],
            "byte_fallback": byte_fallback}


def split_regex(pattern: str, behavior: str = "Isolated", invert: bool = False) -> dict:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": behavior, "invert": invert}


def byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": use_regex}


def sequence(kind: str, items: list[dict]) -> Part:
    """A Sequence normalizer or pre-tokenizer; None when empty, the item itself when single."""
    items = [item for item in items if item is not None]
    if not items:
        return None
    if len(items) == 1:
        return items[0]
    key = "normalizers" if kind == "normalizer" else "pretokenizers"
    return {"type": "Sequence", key: items}


def build(path: Path, model: dict, normalizer: Part = None, pre_tokenizer: Part = None,
          added_tokens: list[dict] = ()) -> HfTokenizer:
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": list(added_tokens),
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": None,
            "decoder": None, "model": model}
    try:
        return HfTokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    except Exception as error:  # tokenizers raises a bare Exception for a spec it rejects
        raise TokenizerError(f"the tokenizer it describes cannot be built: {error}", path=path) from None
