"""Llm.generate's per-token checks: logits that are not finite anywhere in the vocab stop the reply."""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from mnngpu.engine import Logits
from mnngpu.errors import ModelFormatError
from tests.conftest import FIXTURES


@pytest.fixture(scope="module")
def model():
    loaded = mnngpu_llm.create(FIXTURES / "qwen2_int4_b64")   # its folder's own sampler: mixed
    loaded.load()
    return loaded


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_non_finite_logit_anywhere_is_a_model_error(model, monkeypatch, bad, where):
    vocab = model.embedding.vocab_size
    position = {"first": 0, "middle": vocab // 2 + 3, "last": vocab - 1}[where]

    def damaged_forward(ids, all_logits=None):
        logits = np.zeros((1, 1, vocab), dtype=np.float32)
        logits[0, 0, position] = bad
        return logits.view(Logits)

    monkeypatch.setattr(model, "forward", damaged_forward)
    with pytest.raises(ModelFormatError, match="non-finite logits"):
        model.generate([1, 2, 3], max_new_tokens=4)


def test_finite_logits_pass(model, monkeypatch):
    vocab = model.embedding.vocab_size
    logits = np.full((1, 1, vocab), -3e38, dtype=np.float32)   # huge but finite
    logits[0, 0, 7] = 3e38

    monkeypatch.setattr(model, "forward", lambda ids, all_logits=None: logits.view(Logits))
    assert model.generate([1, 2, 3], max_new_tokens=3, stop_ids=()) == [7, 7, 7]
