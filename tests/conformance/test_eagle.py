"""EAGLE on the fixture exported with a draft head (`llmexport --eagle_path`): with greedy sampling
it gives exactly the tokens MNN's runtime recorded and mnngpu's own AR tokens on every backend,
its drafts are accepted on the prompts the head was fitted to, and MNN's own engine with
speculative_type eagle on the same folder streams the same reply.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mnngpu.errors import ConfigError, ModelFormatError
from tests.conformance.test_fixture_models import load
from tests.conformance.test_speculative_models import GREEDY, REPEATS, both_replies, until_stop
from tests.conftest import FIXTURES, reference

NAME = "qwen2_eagle3_int4"
EAGLE = {**GREEDY, "speculative_type": "eagle"}
AR = {**GREEDY, "speculative_type": ""}


def test_the_export_asks_for_eagle_and_its_hidden_states():
    settings = json.loads((FIXTURES / NAME / "config.json").read_text())
    assert settings["speculative_type"] == "eagle" and settings["hidden_states"] is True


def test_eagle_gives_mnn_greedy_tokens(backend_type):
    ref, _ = reference(NAME)
    model = load(NAME, backend_type, **EAGLE)
    for prompt in ref["prompts"]:
        model.reset()
        out = model.generate(prompt["ids"], len(prompt["greedy"]))
        assert out == until_stop(model, prompt["greedy"]), prompt["text"]


def test_eagle_gives_ar_tokens_and_its_drafts_are_accepted(backend_type):
    ar = load(NAME, backend_type, **AR)
    spec = load(NAME, backend_type, **EAGLE)
    accepted = 0
    for text in [REPEATS * 6, "The quick brown fox jumps over the lazy dog."]:
        ar.reset()
        spec.reset()
        ids = ar.tokenizer_encode(text)
        assert spec.generate(ids, 64, stop_ids=()) == ar.generate(ids, 64, stop_ids=()), text
        stats = spec.strategy.stats
        assert stats.drafted > 0 and stats.decode_tokens == 63
        accepted += stats.accepted
    assert accepted > 0 and spec.strategy.stats.tokens_per_forward > 1
    # the cache holds what AR's does: a second turn continues identically
    more = ar.tokenizer_encode(REPEATS)
    assert spec.generate(more, 24, stop_ids=()) == ar.generate(more, 24, stop_ids=())


def test_a_verify_forward_returns_each_rows_hidden_states():
    """The hidden_states rows of a verify block are those of the same ids fed one at a time."""
    spec, one_by_one = load(NAME, "cpu", **EAGLE), load(NAME, "cpu", **EAGLE)
    ids = spec.tokenizer_encode("The quick brown fox")
    block = [5, 17, 42, 99][: spec.pool.verify_length]
    spec.forward(ids)
    spec.verify(block)
    rows = spec.hidden_states()
    one_by_one.forward(ids)
    single = []
    for token in block:
        one_by_one.forward([token])
        single.append(one_by_one.hidden_states()[0])
    assert rows.shape == (len(block), 3 * 64)
    np.testing.assert_allclose(rows, np.array(single), rtol=0, atol=1e-5)


def test_the_draft_heads_ops_are_placed_at_load():
    """Placed with the base model's, so the ready line counts their fallbacks before the first token."""
    ar, spec = load(NAME, "cpu", **AR), load(NAME, "cpu", **EAGLE)
    from mnngpu.format import read_net

    layer_ops = len(read_net(FIXTURES / NAME / "eagle.mnn").ops)
    assert len(spec.runtime.placements.entries) > len(ar.runtime.placements.entries) + layer_ops // 2


def test_eagle_topk_above_one_is_refused_in_one_line():
    with pytest.raises(ConfigError) as error:
        load(NAME, "cpu", **EAGLE, eagle_topk=2)
    assert "eagle_topk 1" in str(error.value) and "\n" not in str(error.value)


def test_hidden_states_of_another_width_name_the_fc_file():
    model = load(NAME, "cpu", **EAGLE)
    with pytest.raises(ModelFormatError) as error:
        model.strategy.draft.propose([1, 2], np.zeros((2, 64), dtype=np.float32), 3)
    assert "eagle_fc.mnn" in str(error.value) and "192 wide" in str(error.value)


def test_a_damaged_d2t_file_is_named(tmp_path):
    folder = tmp_path / NAME
    folder.mkdir()
    for path in (FIXTURES / NAME).iterdir():
        if path.is_file():
            (folder / path.name).symlink_to(path)
    # a graph of many constants (llm.mnn) where one int32 table belongs
    (folder / "eagle_d2t.mnn").unlink()
    (folder / "eagle_d2t.mnn").symlink_to(FIXTURES / NAME / "llm.mnn")
    from mnngpu import llm as mnngpu_llm

    model = mnngpu_llm.create(folder)
    model.set_config(EAGLE)
    with pytest.raises(ModelFormatError) as error:
        model.load()
    assert "eagle_d2t.mnn" in str(error.value)


def test_mnn_runtime_streams_the_same_eagle_reply(tmp_path):
    """MNN's own engine with speculative_type eagle on the same folder: what its response()
    streams starts with exactly the bytes of mnngpu's EAGLE reply (MNN's last verify step may run
    a few tokens past max_new_tokens; skipped without the `mnn` wheel)."""
    pytest.importorskip("MNN.llm")
    for text, reply, tokens, ours in both_replies(NAME, EAGLE, tmp_path):
        assert len(tokens) == 40 and reply.startswith(ours), text
