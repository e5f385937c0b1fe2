"""Our normalizer steps against the library's normalizers, on random text and on every code point."""

from __future__ import annotations

import json
import random
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HfTokenizer
from tokenizers import models

from mnngpu.tokenizer.normalize_steps import normalizer_steps

# Composed and decomposed accents, marks out of canonical order (also spacing marks, which
# accent stripping keeps), Hangul syllables and jamo, singletons and compatibility characters,
# case with special rules (İ, final sigma, Kelvin), CJK (also compatibility ideographs), controls,
# format characters, whitespace of each kind, private use, unassigned and recent code points.
ALPHABET = list("aAzZé\u0301\u0323\u0307\u0345\u0f71\u0f72ñ한\u1100\u1161\u11a8\u212b\u2126ﬁ①½²İΣςK"
                "你好\uf900\u3400\U00020000 \t\n\r\x0b\x0c\x85\xa0\u2000\u3000\x00\x1c\x1f\ufffd\u200b\u200d"
                "\ufeff\ue000\u0378\U00031350\U0001fae8.,!") + ["\U0001d16d\U0001d165", "e\u0301\u0323", "  "]
texts = st.lists(st.sampled_from(ALPHABET), max_size=40).map("".join)

BERT_FLAGS = [(clean, chinese, strip, lower) for clean in (True, False) for chinese in (True, False)
              for strip in (None, True, False) for lower in (True, False)]
SPECS = {
    "NFC": {"type": "NFC"},
    "NFKC": {"type": "NFKC"},
    "prepend, replace": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "replace several characters": {"type": "Replace", "pattern": {"String": "\u0301\u0323"}, "content": "xy z"},
    "strip both": {"type": "Strip", "strip_left": True, "strip_right": True},
    "strip left": {"type": "Strip", "strip_left": True, "strip_right": False},
    **{f"bert {flags}": {"type": "BertNormalizer", "clean_text": flags[0], "handle_chinese_chars": flags[1],
                         "strip_accents": flags[2], "lowercase": flags[3]} for flags in BERT_FLAGS},
}


def ours(spec: dict, text: str) -> str:
    for step in normalizer_steps(spec):
        text = step(text)
    return text


@cache
def library_normalizer(name: str):
    """The library's normalizer for SPECS[name], built from its tokenizer.json form."""
    spec = json.loads(HfTokenizer(models.BPE()).to_str())
    spec["normalizer"] = SPECS[name]
    return HfTokenizer.from_str(json.dumps(spec)).normalizer


def library_normalize(name: str, text: str) -> str:
    return library_normalizer(name).normalize_str(text)


@pytest.mark.parametrize("name", SPECS)
@settings(max_examples=120, deadline=None)
@given(text=texts)
def test_random_text_normalizes_as_the_library_does_it(name, text):
    assert ours(SPECS[name], text) == library_normalize(name, text)


@pytest.mark.parametrize("name", ["NFC", "NFKC", "bert (True, True, None, True)", "bert (False, False, True, False)"])
def test_every_code_point_normalizes_as_the_library_does_it(name):
    """All code points, shuffled into short texts, so that each also meets random neighbours."""
    points = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    random.Random(11).shuffle(points)
    texts = ["".join(points[k:k + 256]) for k in range(0, len(points), 256)]
    wrong = [t for t in texts if ours(SPECS[name], t) != library_normalize(name, t)]
    assert not wrong


@pytest.mark.parametrize("spec", [
    {"type": "Lowercase"}, {"type": "NFD"}, {"type": "NFKD"}, {"type": "StripAccents"},
    {"type": "Replace", "pattern": {"Regex": " +"}, "content": " "},
    {"type": "Replace", "pattern": {"String": ""}, "content": "x"},
    {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]},
])
def test_normalizers_not_done_here_are_refused(spec):
    assert normalizer_steps(spec) is None


def test_no_normalizer_is_no_step():
    assert normalizer_steps(None) == []
