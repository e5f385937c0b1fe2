"""A mix export (gemma3_mix_int4: a sliding layer with a key window of 8, then a full layer)
through the paths that decide where a query's window starts in the KV cache: prefill chunks far
smaller than the prompt, and a prefix reloaded from disk before the rest is prefilled. The
attention_mask feed and the one warning line of a sliding export.

Truth: MNN's recorded greedy tokens and first-step logits (tests/mnn_oracle.py)."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest

from mnngpu.config import ConfigWarning
from mnngpu.errors import ConfigError
from mnngpu.runtime.attention_mask import mask_feed
from tests.conformance.test_fixture_models import LOGIT_TOLERANCE, greedy, load
from tests.conftest import FIXTURES, backend_or_skip, reference

MIX, SLIDING = "gemma3_mix_int4", "gemma3_sliding_int4"
LONG = 4   # the 179-id prompt


def assert_matches_mnn(tokens, first, k: int) -> None:
    ref, first_logits = reference(MIX)
    assert np.abs(first - first_logits[k]).max() <= LOGIT_TOLERANCE * first_logits[k].std()
    assert tokens == ref["prompts"][k]["greedy"]


def test_chunks_smaller_than_the_prompt_agree_with_mnn(backend_type):
    """Chunks of 13 ids: most windows reach back into an earlier chunk."""
    prompt = reference(MIX)[0]["prompts"][LONG]
    model = load(MIX, backend_type, chunk=13)
    assert_matches_mnn(*greedy(model, prompt["ids"], len(prompt["greedy"])), LONG)


@pytest.mark.parametrize("backend", ["cpu", "opencl", "vulkan"])
def test_a_reloaded_prefix_then_the_rest_agree_with_mnn(tmp_path, backend):
    backend_or_skip(backend)
    prompt = reference(MIX)[0]["prompts"][LONG]
    head, rest = prompt["ids"][:30], prompt["ids"][30:]
    settings = {"prefix_cache_path": str(tmp_path / "prefixes")}
    assert load(MIX, backend, **settings).cache_prefix(head) == 0
    model = load(MIX, backend, **settings)
    model.reset()
    assert model.cache_prefix(head) == len(head)
    first = np.asarray(model.forward(rest))[0, -1]
    tokens = [int(np.argmax(first))]
    while len(tokens) < len(prompt["greedy"]):
        tokens.append(int(np.argmax(np.asarray(model.forward([tokens[-1]]))[0, -1])))
    assert_matches_mnn(tokens, first, LONG)


def test_the_feed_carries_each_masks_window():
    assert mask_feed("mix", 8).reshape(-1).tolist() == [0, 8]
    assert mask_feed("sliding", 8).reshape(-1).tolist() == [0]
    assert mask_feed("full", 0).shape == (1, 1, 1, 1)


def test_a_sliding_export_says_once_that_its_window_is_not_applied():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load(SLIDING, "cpu")
    lines = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning) and "sliding_window" in str(w.message)]
    assert len(lines) == 1 and "not applied" in lines[0] and str(FIXTURES / SLIDING) in lines[0]


def test_a_mix_export_without_a_window_is_a_config_error(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(FIXTURES / MIX, folder, ignore=shutil.ignore_patterns("hf"))
    config = (folder / "llm_config.json").read_text().replace('"sliding_window": 8', '"sliding_window": 0')
    (folder / "llm_config.json").write_text(config)
    with pytest.raises(ConfigError, match="sliding_window") as caught:
        load(folder, "cpu")
    assert caught.value.field == "sliding_window"
