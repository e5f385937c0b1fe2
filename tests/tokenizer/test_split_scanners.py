"""Our pre-tokenizer scanners against the library's own pre-tokenizers: random text, plus every
code point where a scanner hard-codes a fact (the contraction letters, the class of each character)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, normalizers, pre_tokenizers

from mnngpu.tokenizer import split_scanners as scan
from mnngpu.tokenizer.normalize_steps import code_points

# Every class each scanner tells apart: letters (with case and the long s, which case-folds to
# "s"), digits of several kinds, each sort of whitespace, marks, symbols, unassigned code points,
# contractions and apostrophes, and the metaspace.
ALPHABET = list("abcxyzSTMDREVLſKİßé你好한語٣²½Ⅻ0123456789 \t\n\r\x0b\x0c\x85\xa0\u2000\u2028\u3000"
                "\x1c\x1f\u200b\u200d\ufeff\u0301\u0345.,!?-_()[]<>|#$%'’\"`~👍🏽😀\ue000\u0378\uffff"
                "\U00010000\U00031350▁") + ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'ſ",
                                            " 's", "  ", "\r\n", " \n ", "▁▁"]
texts = st.lists(st.sampled_from(ALPHABET), max_size=60).map("".join)
REGEX_SCANNERS = {"qwen": (scan.QWEN_PATTERN, 1), "llama3": (scan.LLAMA3_PATTERN, 3), "gpt2": (scan.GPT2_PATTERN, 0)}


def our_words(kind: str, text: str) -> list[str]:
    cps = code_points(text)
    starts, ends = np.empty(len(cps), np.int64), np.empty(len(cps), np.int64)
    whole = (np.zeros(1, np.int64), np.full(1, len(cps), np.int64), 1, starts, ends)
    if kind == "metaspace":
        n = scan.split_metaspace_runs(cps, *whole)
    elif kind == "bert":
        table = scan.bert_classes()
        table.fill_for(cps)
        n = scan.split_bert_words(cps, table.values, *whole)
    else:
        table = scan.regex_classes()
        table.fill_for(cps)
        if kind == "gpt2":
            n = scan.split_gpt2_words(cps, table.values, *whole)
        else:
            n = scan.split_qwen_words(cps, table.values, *whole, REGEX_SCANNERS[kind][1])
    return [text[a:b] for a, b in zip(starts[:n].tolist(), ends[:n].tolist())]


def library_words(kind: str, text: str) -> list[str]:
    if kind == "bert":
        pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    else:
        pattern = scan.METASPACE_RUNS_PATTERN if kind == "metaspace" else REGEX_SCANNERS[kind][0]
        pre_tokenizer = pre_tokenizers.Split(Regex(pattern), "isolated")
    return [word for word, _ in pre_tokenizer.pre_tokenize_str(text)]


@pytest.mark.parametrize("kind", [*REGEX_SCANNERS, "bert", "metaspace"])
@settings(max_examples=300, deadline=None)
@given(text=texts)
def test_random_text_splits_as_the_library_splits_it(kind, text):
    assert our_words(kind, text) == library_words(kind, text)


@pytest.mark.parametrize("kind", [*REGEX_SCANNERS, "bert", "metaspace"])
def test_a_long_random_text_splits_as_the_library_splits_it(kind):
    rng = random.Random(7)
    text = "".join(rng.choice(ALPHABET) for _ in range(20000))
    assert our_words(kind, text) == library_words(kind, text)


def test_gpt2_scanner_is_the_byte_level_pre_tokenizers_split():
    text = "Hello world's  end\n\n  x 123 4567 ‼ ok  "
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    mapped = [word for word, _ in byte_level.pre_tokenize_str(text)]
    split = library_words("gpt2", text)
    assert len(mapped) == len(split) == len(our_words("gpt2", text))


def all_code_points(planes: int = 17) -> list[str]:
    return [chr(c) for c in range(0x10000 * planes) if not 0xD800 <= c < 0xE000]


def cased_code_points() -> list[str]:
    """Planes 0 and 1: every character with a case mapping or folding is in them."""
    return [c for c in all_code_points(planes=2) if c != "\n"]


def matched_segments(pattern: str, segments: list[str]) -> list[bool]:
    """Whether the regex matches at the start of each segment (the library's Oniguruma)."""
    marked = normalizers.Replace(Regex(f"\n(?:{pattern})"), "\n\x00")
    out = marked.normalize_str("\n" + "\n".join(segments)).split("\n")[1:]
    assert len(out) == len(segments)
    return [piece.startswith("\x00") for piece in out]


@pytest.mark.parametrize("ignore_case, pattern", [(True, "(?i:'s|'t|'m|'d)"), (False, "'s|'t|'m|'d")])
def test_the_two_letter_contractions_match_exactly_the_characters_oniguruma_matches(ignore_case, pattern):
    chars = cased_code_points()
    library = matched_segments(pattern, [f"'{c}" for c in chars])
    ours = [scan._contraction_length(ord(c), -1, ignore_case) == 2 for c in chars]
    assert ours == library


@pytest.mark.parametrize("ignore_case", [True, False])
@pytest.mark.parametrize("fixed, first", [("e", True), ("r", False), ("v", False), ("l", False), ("l", True)])
def test_the_three_letter_contractions_match_exactly_the_characters_oniguruma_matches(ignore_case, fixed, first):
    """'re 've 'll: every character in one place, with a fixed letter in the other."""
    pattern = "'re|'ve|'ll"
    pattern = f"(?i:{pattern})" if ignore_case else pattern
    chars = cased_code_points()
    pairs = [(c, fixed) if first else (fixed, c) for c in chars]
    library = matched_segments(pattern, [f"'{a}{b}" for a, b in pairs])
    ours = [scan._contraction_length(ord(a), ord(b), ignore_case) == 3 for a, b in pairs]
    assert ours == library


def test_the_class_table_agrees_with_the_patterns_own_negated_class_on_every_code_point():
    chars = all_code_points()
    text = "".join(chars)
    table = scan.regex_classes()
    table.fill_for(code_points(text))
    other = normalizers.Replace(Regex(r"[^\s\p{L}\p{N}]"), "a").normalize_str(text)
    library = [after == "a" and before != "a" for before, after in zip(text, other)]
    ours = (table.values[[ord(c) for c in chars]] & scan.ANY_CLASS == 0).tolist()
    assert ours == library
