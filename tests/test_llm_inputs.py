"""Llm's own checks on what callers pass it."""

from __future__ import annotations

import pytest

from mnngpu import llm as mnngpu_llm
from mnngpu.errors import InputError
from tests.conftest import FIXTURES, reference


@pytest.fixture(scope="module")
def model():
    m = mnngpu_llm.create(FIXTURES / "qwen2_int4_b64")
    m.set_config({"precision": "high", "sampler_type": "greedy"})
    m.load()
    return m


def test_non_text_prompt_is_an_input_error(model):
    with pytest.raises(InputError, match="expected text"):
        model.tokenizer_encode(123)


@pytest.mark.parametrize("bad", ["a", -1, 2.5, True])
def test_bad_max_new_tokens_is_an_input_error(model, bad):
    with pytest.raises(InputError, match="max_new_tokens"):
        model.generate([1, 2, 3], max_new_tokens=bad)


def test_a_reply_stops_at_max_all_tokens(model):
    """Like MNN, generation ends when the cache is full rather than failing mid-reply."""
    ref, _ = reference("qwen2_int4_b64")
    ids = ref["prompts"][1]["ids"]
    model.set_config({"max_all_tokens": len(ids) + 4})
    try:
        model.reset()
        out = model.generate(ids, max_new_tokens=50)
        assert out == ref["prompts"][1]["greedy"][: len(out)]
        assert 1 <= len(out) <= 5
        assert model.runtime.kv_meta.previous <= len(ids) + 4
    finally:
        model.set_config({"max_all_tokens": 2048})
