"""The tokenizer fixtures (tests/fixtures/tokenizers/<name>/) and their recorded references."""

from __future__ import annotations

import json
import unicodedata
from functools import lru_cache
from pathlib import Path

from mnngpu.tokenizer import Tokenizer, load_tokenizer
from tools.make_tokenizer_fixtures import FIXTURE_ROOT, reference

MODEL_FIXTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "models").glob("*/tokenizer.mtok"))

# MNN's Python binding returns a token's text through a C string, so the NUL byte comes back empty.
MNN_DECODE_NUL = b"\x00"


@lru_cache(maxsize=None)
def unigram_pieces(name: str) -> list[tuple[str, float]] | None:
    """The source tokenizer.json's Unigram (piece, score) list, or None for any other model."""
    source = reference(name)["source"]
    if source["library"] != "tokenizers":
        return None
    model = json.loads((FIXTURE_ROOT / name / source["file"]).read_text(encoding="utf-8"))["model"]
    return [tuple(p) for p in model["vocab"]] if model["type"] == "Unigram" else None


def encodes_as_source(name: str, ids: list[int], source_ids: list[int]) -> bool:
    """ids are the source library's, or, for a Unigram model, the same text cut into pieces whose
    scores sum to the same total: an exact tie, which a .mtok file breaks as MNN does and the
    library another way (mnngpu/tokenizer/unigram_lattice.py)."""
    if ids == source_ids:
        return True
    pieces = unigram_pieces(name)
    if pieces is None or len(ids) == 0 or max(ids + source_ids) >= len(pieces):
        return False
    texts = [[pieces[i][0] for i in seq] for seq in (ids, source_ids)]
    totals = [sum(pieces[i][1] for i in seq) for seq in (ids, source_ids)]
    return "".join(texts[0]) == "".join(texts[1]) and abs(totals[0] - totals[1]) <= 1e-9 * abs(totals[1])


@lru_cache(maxsize=None)
def tokenizer(name: str) -> Tokenizer:
    return load_tokenizer(FIXTURE_ROOT / name, reference(name)["tokenizer_file"])


def lossless_text(name: str, text: str) -> str | None:
    """What decoding the ids of `text` must give back, or None where the format loses information."""
    ref = reference(name)
    library = ref["source"]["library"]
    if "bert" in name:
        return None                      # lowercased, accents stripped, spaces dropped
    if name == "mtok_unigram":
        return None                      # no byte fallback: an unknown character becomes <unk>
    if library == "sentencepiece" or name == "mtok_llama":
        specials = ref["source"].get("special_tokens") or {"<s>": 1, "</s>": 2, "<unk>": 0}
        if not text or any(s in text for s in specials):
            return None                  # each piece of text between specials gets its own "▁"
        if name == "mtok_llama" and text.startswith(" "):
            return text                  # HF's Metaspace adds no "▁" before a leading space
        return " " + text                # the dummy prefix decodes as a space
    if name in ("huggingface", "mtok_qwen") and unicodedata.normalize("NFC", text) != text:
        return None                      # NFC first
    return text
