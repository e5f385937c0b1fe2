"""The fast path (FastEncoder) against the library running the same tokenizer.json in full: the
fixtures, and pipelines built from their parts that the fixtures do not have."""

from __future__ import annotations

import json
import random
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HfTokenizer

from mnngpu.tokenizer import split_scanners as scan
from mnngpu.tokenizer.fast_encoder import FastEncoder
from tests.tokenizer.tokenizer_fixtures import tokenizer
from tools.make_tokenizer_fixtures import FIXTURE_NAMES

FAST = ["bert", "huggingface", "mtok_bert", "mtok_qwen", "sentencepiece", "tiktoken"]
# Spaces and controls, letters with and without case, accents composed and not, CJK (also a
# compatibility ideograph), Hangul syllables and jamo, digits of several kinds, marks, emoji,
# contractions, the metaspace, byte-token look-alikes, every fixture's special tokens and the
# added tokens of PIPELINES.
ALPHABET = list(" \t\n\r\x0b\x0c\x85\xa0\u2000\u3000\x00\x1c\x1f\ufffd\u200b\ufeffab AZ'sſKİßΣςé\u0301\u0323"
                "\u0307\u0345ñ你好的中文日本語\uf900한\u1100\u1161\u11a8😀👍🏽\u200d🏳️\ufe0f0123456789٣²½Ⅻ"
                ".,!?-_()[]<>|#▁ﬁ①\ue000\u0378\U00031350\U0001d165") + \
    ["'s", "'LL", "'re", "<0x41>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "[SEP]", "[CLS]",
     "[MASK]", "hello", " world", "  ", "\r\n", "ﬁx", "fix", "<think>", "ab",
     "\U0001d16d\U0001d165"]   # two spacing marks out of canonical order
texts = st.lists(st.sampled_from(ALPHABET), max_size=50).map("".join)


def library_ids(backend: HfTokenizer, text: str) -> list[int]:
    return backend.encode(text, add_special_tokens=False).ids


def variant(name: str, **parts) -> HfTokenizer:
    """The fixture's tokenizer with some tokenizer.json parts replaced."""
    spec = json.loads(tokenizer(name)._backend.to_str())
    spec.update(parts)
    return HfTokenizer.from_str(json.dumps(spec))


def fast(backend: HfTokenizer) -> FastEncoder:
    encoder = FastEncoder.for_backend(backend)
    assert encoder is not None
    return encoder


def test_the_fixtures_that_take_the_fast_path():
    assert [n for n in FIXTURE_NAMES if tokenizer(n)._fast_path is not None] == FAST


@pytest.mark.parametrize("name", FAST)
@settings(max_examples=150, deadline=None)
@given(text=texts)
def test_random_text_gets_the_librarys_ids(name, text):
    tok = tokenizer(name)
    assert tok.encode(text) == tok.prefix_ids + library_ids(tok._backend, text)


@pytest.mark.parametrize("name", FAST)
def test_a_long_varied_text_gets_the_librarys_ids_cold_and_warm(name):
    rng = random.Random(3)
    text = "".join(rng.choice(ALPHABET) for _ in range(30000))
    backend = tokenizer(name)._backend
    encoder = fast(backend)
    expected = library_ids(backend, text)
    assert encoder.encode(text) == expected
    assert encoder.encode(text) == expected
    assert encoder.encode(text[7:]) == library_ids(backend, text[7:])


GPT2_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}


def split(pattern: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def added(token_id: int, content: str, normalized: bool) -> dict:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": normalized, "special": not normalized}


PIPELINES = {
    "gpt2 byte level": ("tiktoken", {"pre_tokenizer": GPT2_BYTE_LEVEL}),
    "llama3 split": ("tiktoken", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        split(scan.LLAMA3_PATTERN), {**GPT2_BYTE_LEVEL, "use_regex": False}]}}),
    "two splits": ("huggingface", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        split(scan.QWEN_PATTERN), split(scan.GPT2_PATTERN), {**GPT2_BYTE_LEVEL, "use_regex": False}]}}),
    "nfkc with normalized added tokens": ("mtok_qwen", {"normalizer": {"type": "NFKC"}, "added_tokens": [
        added(697, "<|endoftext|>", False), added(698, "ﬁx", True), added(699, "<think>", True),
        added(650, "ab", True)]}),
    "bert cased, accents kept": ("bert", {"normalizer": {
        "type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": False, "strip_accents": False,
        "lowercase": False}}),
    "bert uncleaned, accents stripped": ("bert", {"normalizer": {
        "type": "BertNormalizer", "clean_text": False, "handle_chinese_chars": True, "strip_accents": True,
        "lowercase": False}}),
    "strip, prepend and replace": ("sentencepiece", {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": True}, {"type": "NFC"},
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}}),
}


@cache
def built(pipeline: str) -> tuple[HfTokenizer, FastEncoder]:
    name, parts = PIPELINES[pipeline]
    backend = variant(name, **parts)
    return backend, fast(backend)


@pytest.mark.parametrize("pipeline", PIPELINES)
@settings(max_examples=150, deadline=None)
@given(text=texts)
def test_pipelines_beyond_the_fixtures_get_the_librarys_ids(pipeline, text):
    backend, encoder = built(pipeline)
    assert encoder.encode(text) == library_ids(backend, text)


@pytest.mark.parametrize("name, parts", [
    ("tiktoken", {"pre_tokenizer": {"type": "Digits", "individual_digits": True}}),
    ("tiktoken", {"pre_tokenizer": split(r"\s+")}),
    ("tiktoken", {"pre_tokenizer": {**GPT2_BYTE_LEVEL, "add_prefix_space": True}}),
    ("tiktoken", {"pre_tokenizer": None}),
    ("sentencepiece", {"normalizer": {"type": "Replace", "pattern": {"Regex": " +"}, "content": "▁"}}),
    ("sentencepiece", {"normalizer": {"type": "Lowercase"}}),
    ("mtok_qwen", {"added_tokens": [{**added(697, "<|endoftext|>", False), "lstrip": True}]}),
    ("mtok_qwen", {"added_tokens": [{**added(697, "<|endoftext|>", False), "single_word": True}]}),
    ("mtok_qwen", {"truncation": {"direction": "Right", "max_length": 8, "strategy": "LongestFirst",
                                  "stride": 0}}),
])
def test_parts_the_fast_path_does_not_do_leave_the_whole_pipeline_to_the_library(name, parts):
    assert FastEncoder.for_backend(variant(name, **parts)) is None


def test_a_lone_surrogate_is_an_input_error():
    """The library rejects it with a TypeError; we say what is wrong with the text."""
    from mnngpu.errors import InputError

    tok = tokenizer("tiktoken")
    with pytest.raises(TypeError):
        tok._backend.encode("a\ud800b")
    with pytest.raises(InputError, match="not valid Unicode"):
        tok.encode("a\ud800b")
