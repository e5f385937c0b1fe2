"""Bad arguments to a loaded model, and files the system refuses to open: each is one MnnGpuError."""

from __future__ import annotations

import builtins
import io
import warnings
from pathlib import Path

import numpy as np
import pytest

from mnngpu import llm
from mnngpu.errors import (
    ConfigError,
    InputError,
    MnnGpuError,
    ModelFormatError,
    TokenizerError,
    WeightFileError,
)
from tests.robustness.folders import first_failure, model_copy, untouched

MODEL = "qwen2_int4_b64"
VOCAB = 480  # the fixture's lm_head rows (tests/fixtures/models/*/hf/config.json: vocab_size)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = model_copy(tmp_path_factory.mktemp("bad_calls"), MODEL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = llm.create(folder)
        loaded.set_config({"thread_num": 1})
        loaded.load()
    return loaded


@pytest.mark.parametrize("ids", [[-1], [VOCAB], [2**40], [], [[1, 2]], ["a"], [1.5], [True], None, 7, {1, 2}],
                         ids=repr)
def test_ids_the_model_cannot_take(model, ids):
    with pytest.raises(InputError, match="input_ids"):
        model.forward(ids)


def test_the_last_id_of_the_vocabulary_is_fine(model):
    model.reset()
    assert model.forward([0, VOCAB - 1]).shape == (1, 1, VOCAB)


def test_more_tokens_than_max_all_tokens(model):
    model.set_config({"max_all_tokens": 6})
    try:
        model.reset()
        with pytest.raises(InputError, match="max_all_tokens"):
            model.forward([1] * 7)
        model.forward([1] * 4)
        with pytest.raises(InputError, match="7 tokens exceed max_all_tokens=6"):
            model.forward([1] * 3)  # together with the 4 in the KV cache
        model.reset()
        with pytest.raises(InputError, match="max_all_tokens"):
            model.response("a prompt longer than six tokens once templated", max_new_tokens=1)
    finally:
        model.set_config({"max_all_tokens": 2048})
        model.reset()


@pytest.mark.parametrize("prompt", [123, None, b"bytes", ["not a message"], [{"content": "no role"}]], ids=repr)
def test_prompts_that_are_not_text_or_messages(model, prompt):
    with pytest.raises(InputError):
        model.response(prompt, max_new_tokens=1)


@pytest.mark.parametrize("overrides", ['{"thread_num": 0', '{"max_all_tokens": "many"}', "[1]",
                                       {"precision": 3}, {"backend_type": 5}], ids=repr)
def test_bad_set_config_leaves_the_config_as_it_was(model, overrides):
    before = model.config.raw
    with pytest.raises(ConfigError, match="set_config"):
        model.set_config(overrides)
    assert model.config.raw == before


def test_forward_before_load(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unloaded = llm.create(model_copy(tmp_path, MODEL))
    with pytest.raises(MnnGpuError, match="load"):
        unloaded.forward([1])


# ---- a file the system will not open: wrapped where it is opened --------------------------

@pytest.mark.parametrize(("name", "error", "stage"), [
    ("config.json", ConfigError, "create"), ("llm_config.json", ConfigError, "create"),
    ("llm.mnn", ModelFormatError, "load"), ("llm.mnn.weight", WeightFileError, "load"),
    ("embeddings_bf16.bin", WeightFileError, "load"), ("tokenizer.mtok", TokenizerError, "load"),
])
def test_permission_denied(tmp_path, monkeypatch, name, error, stage):
    # Root reads any file, so a denied open is simulated at the one place every reader goes through.
    folder = model_copy(tmp_path, MODEL)
    denied = (folder / name).resolve()
    real_open = builtins.open

    def guarded_open(file, *args, **kwargs):
        if isinstance(file, str | Path) and Path(file).resolve() == denied:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    with untouched(folder), monkeypatch.context() as patched:
        patched.setattr(builtins, "open", guarded_open)
        patched.setattr(io, "open", guarded_open)
        reached, raised = first_failure(folder)
    assert (reached, type(raised)) == (stage, error), raised
    assert str(denied) in str(raised) and "Permission denied" in str(raised)


def test_logits_are_finite_for_every_fixture_row(model):
    # The embedding check rejects a NaN row; a sound table must never trip it.
    model.reset()
    rows = model.embedding.rows(np.arange(VOCAB))
    assert np.isfinite(rows).all() and rows.shape == (VOCAB, 128)
