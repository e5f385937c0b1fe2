"""Our numba BPE (BpeWords) against the library's BPE model on the same words: byte-level and
SentencePiece-style vocabularies, each way of handling an unknown character, and long words."""

from __future__ import annotations

import json
import random
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HfTokenizer

from mnngpu.tokenizer.bpe_model import BpeWords
from mnngpu.tokenizer.fast_encoder import LibraryWords
from mnngpu.tokenizer.normalize_steps import code_points
from tests.tokenizer.tokenizer_fixtures import tokenizer

MODELS = {
    "byte level": ("tiktoken", {}, True),
    "byte fallback": ("sentencepiece", {}, False),
    "unknown, fused": ("sentencepiece", {"byte_fallback": False, "fuse_unk": True}, False),
    "unknown, one each": ("sentencepiece", {"byte_fallback": False, "fuse_unk": False}, False),
    "unknown dropped": ("sentencepiece", {"byte_fallback": False, "unk_token": None}, False),
    "fallback and fused": ("sentencepiece", {"byte_fallback": True, "fuse_unk": True}, False),
}
CHARACTERS = list("▁abcdefghijklmnopqrstuvwxyzAT ,.'\n你好é😀\u0301\x00\uffff") + ["▁the", "▁a", "<0x41>", "<unk>"]
words = st.lists(st.sampled_from(CHARACTERS), min_size=1, max_size=30).map("".join)


@cache
def models(kind: str) -> tuple[BpeWords, LibraryWords]:
    name, changes, byte_level = MODELS[kind]
    spec = json.loads(tokenizer(name)._backend.to_str())
    spec["model"].update(changes)
    model = HfTokenizer.from_str(json.dumps(spec)).model
    ours = BpeWords.for_model(model.__getstate__(), byte_level)
    assert ours is not None
    return ours, LibraryWords(HfTokenizer(model), byte_level)


def ids_of(model, word_list: list[str]) -> list[list[int]]:
    pool = code_points("".join(word_list)).copy()
    lengths = np.array([len(w) for w in word_list], np.int64)
    spans = np.stack([np.cumsum(lengths) - lengths, lengths], axis=1)
    counts, flat = model(pool, spans)
    cuts = np.cumsum(counts)[:-1]
    return [part.tolist() for part in np.split(np.asarray(flat), cuts)]


@pytest.mark.parametrize("kind", MODELS)
@settings(max_examples=200, deadline=None)
@given(word_list=st.lists(words, min_size=1, max_size=8))
def test_words_get_the_library_models_ids(kind, word_list):
    ours, library = models(kind)
    assert ids_of(ours, word_list) == ids_of(library, word_list)


@pytest.mark.parametrize("kind", ["byte level", "byte fallback"])
def test_long_words_get_the_library_models_ids(kind):
    rng = random.Random(5)
    word_list = ["a" * 5000, "▁" + "ab" * 3000, "".join(rng.choice(CHARACTERS[:30]) for _ in range(8000))]
    ours, library = models(kind)
    assert ids_of(ours, word_list) == ids_of(library, word_list)


@pytest.mark.parametrize("changes", [{"dropout": 0.5}, {"ignore_merges": True},
                                     {"continuing_subword_prefix": "##"}, {"end_of_word_suffix": "</w>"},
                                     {"unk_token": "<not in the vocab>"}])
def test_options_not_done_here_are_refused(changes):
    spec = json.loads(tokenizer("sentencepiece")._backend.model.__getstate__())
    spec.update(changes)
    assert BpeWords.for_model(json.dumps(spec).encode(), byte_level=False) is None
