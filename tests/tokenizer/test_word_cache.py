"""The word cache: each distinct word goes to the model once, and the ids come back in order,
through table growth, a full cache starting afresh, and a model that fails."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mnngpu.tokenizer import word_cache
from mnngpu.tokenizer.normalize_steps import code_points
from mnngpu.tokenizer.word_cache import WordCache


class CountingModel:
    """Ids that spell each word: its code points, then its length (so words never share ids)."""

    def __init__(self):
        self.asked: list[str] = []

    def __call__(self, cp_pool: np.ndarray, spans: np.ndarray):
        words = [cp_pool[s:s + n].tobytes().decode("utf-32-le") for s, n in spans.tolist()]
        self.asked += words
        ids = [[ord(c) for c in w] + [len(w)] for w in words]
        return np.array([len(x) for x in ids], np.int64), np.array([i for x in ids for i in x], np.int64)


def spelled(words: list[str]) -> list[int]:
    return [i for w in words for i in [*map(ord, w), len(w)]]


def cached_ids(cache: WordCache, model, words: list[str]) -> list[int]:
    text = "".join(words)
    lengths = np.array([len(w) for w in words], np.int64)
    ends = np.cumsum(lengths)
    return cache.ids(code_points(text), ends - lengths, ends, len(words), model).tolist()


def random_words(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice("abcdé你😀 ") for _ in range(rng.randint(1, 9))) for _ in range(count)]


def test_each_distinct_word_is_asked_once_through_many_table_growths():
    cache, model = WordCache(), CountingModel()
    words = random_words(60000, seed=1)
    assert cached_ids(cache, model, words) == spelled(words)
    assert sorted(model.asked) == sorted(set(words))
    more = random_words(30000, seed=2) + words[:100]
    assert cached_ids(cache, model, more) == spelled(more)
    assert len(model.asked) == len(set(words) | set(more))


def test_the_model_gets_its_spans_in_one_layout_for_one_new_word_or_many():
    """numba compiles a kernel once per array layout: a one-row slice is C-contiguous and a longer
    one is not, so the model (our numba BPE) would compile a second time in the run after the first."""
    layouts = []

    class LayoutModel(CountingModel):
        def __call__(self, cp_pool, spans):
            layouts.append(spans.flags.c_contiguous)
            return super().__call__(cp_pool, spans)

    cache, model = WordCache(), LayoutModel()
    assert cached_ids(cache, model, ["one"]) == spelled(["one"])
    assert cached_ids(cache, model, ["two", "three", "four"]) == spelled(["two", "three", "four"])
    assert layouts == [True, True]


def test_a_full_cache_starts_afresh_and_still_gives_the_right_ids(monkeypatch):
    monkeypatch.setattr(word_cache, "MAX_CACHED_WORDS", 100)
    cache, model = WordCache(), CountingModel()
    first, second = random_words(500, seed=3), random_words(500, seed=4)
    assert cached_ids(cache, model, first) == spelled(first)
    assert cached_ids(cache, model, second) == spelled(second)
    assert len(cache) == len(set(second))


def test_a_failing_model_leaves_no_word_without_ids():
    cache, model = WordCache(), CountingModel()
    assert cached_ids(cache, model, ["kept"]) == spelled(["kept"])

    def failing(cp_pool, spans):
        raise RuntimeError("model failed")
    with pytest.raises(RuntimeError, match="model failed"):
        cached_ids(cache, failing, ["new", "words"])
    assert cached_ids(cache, model, ["new", "kept", "words"]) == spelled(["new", "kept", "words"])


def test_no_words_give_no_ids():
    assert cached_ids(WordCache(), CountingModel(), []) == []
