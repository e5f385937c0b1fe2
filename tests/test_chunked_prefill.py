"""chunk / chunk_limits: a long prefill runs in pieces, as MNN's does. Truths: the same pieces fed
by hand (identical logits), the unsplit prefill and MNN's recorded first-step logits (within float
error)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mnngpu.errors import ConfigError
from tests.reference_model import MODEL_DIR, load_model, recorded

IDS = recorded("hello")["ids"] * 7


def test_chunk_splits_the_prefill_into_pieces():
    chunked = load_model(chunk=5)
    runs = []
    for module in chunked.pool.modules.values():   # count module forwards
        original = module.forward
        module.forward = lambda feeds, names, original=original: runs.append(len(feeds["position_ids"][0])) \
            or original(feeds, names)
    got = np.asarray(chunked.forward(IDS))[0, -1]
    assert runs == [5] * (len(IDS) // 5) + ([len(IDS) % 5] if len(IDS) % 5 else [])

    by_hand = load_model()
    for start in range(0, len(IDS), 5):
        want = np.asarray(by_hand.forward(IDS[start: start + 5]))[0, -1]
    np.testing.assert_array_equal(got, want)
    whole = np.asarray(load_model().forward(IDS))[0, -1]
    np.testing.assert_allclose(got, whole, rtol=0, atol=1e-4 * np.abs(whole).max())


def test_chunk_limits_override_chunk_and_all_logits_join_the_pieces():
    got = np.asarray(load_model(chunk=3, chunk_limits=[1, 4], all_logits=True).forward(IDS))[0]
    whole = np.asarray(load_model(all_logits=True).forward(IDS))[0]
    assert got.shape == whole.shape
    np.testing.assert_allclose(got, whole, rtol=0, atol=1e-4 * np.abs(whole).max())


def test_chunked_logits_agree_with_mnn():
    """MNN's recorded logits of its longest prompt (179 ids, prefilled whole), against 3 pieces."""
    prompts = json.loads((MODEL_DIR / "reference.json").read_text())["prompts"]
    index = max(range(len(prompts)), key=lambda i: len(prompts[i]["ids"]))
    mnn = np.load(MODEL_DIR / "first_logits.npy")[index]
    got = np.asarray(load_model(chunk=64).forward(prompts[index]["ids"]))[0, -1]
    assert np.abs(got - mnn).max() < 1e-3 * mnn.std()


@pytest.mark.parametrize("limits", [[128], [0, 4], "128"])
def test_bad_chunk_limits_are_a_config_error(limits):
    with pytest.raises(ConfigError) as caught:
        load_model(chunk_limits=limits)
    assert caught.value.field == "chunk_limits"
