"""Llm's lifecycle as MNN's: load() reads the tokenizer first and fails early without one; set_config
after load() reaches the chat template and the sampler; a key only load() reads says it waits for the
next load(); context.json is merged at load, over a set_config made before it (the MNN oracle side
of that is in test_config.py)."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest

from mnngpu import llm
from mnngpu.config import ConfigWarning
from mnngpu.errors import TokenizerError
from tests.reference_model import MODEL_DIR, ORACLE_CONFIG, hf_count, hf_render, load_model, recorded

SYSTEM = "You are a terse assistant."


def test_load_fails_early_without_a_tokenizer(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(MODEL_DIR, folder, ignore=shutil.ignore_patterns("tokenizer.*", "hf"))
    model = llm.create(folder / "config.json")
    with pytest.raises(TokenizerError) as caught:
        model.load()
    assert "tokenizer" in str(caught.value)
    assert not hasattr(model, "runtime")  # it failed before building anything


def test_set_config_after_load_reaches_the_chat_template():
    model = load_model()
    question = "Where does the farmer walk?"
    model.set_config({"system_prompt": SYSTEM})
    assert model.apply_chat_template(question) == hf_render(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    model.response(question, max_new_tokens=1)
    assert model.context.prompt_len == hf_count(hf_render(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]))
    model.set_config({"use_template": False})
    model.response(question, max_new_tokens=1)
    assert model.context.prompt_len == hf_count(question)


def test_set_config_after_load_reaches_the_sampler():
    """Loaded with a hot temperature sampler, then switched to greedy: MNN's recorded greedy tokens."""
    model = load_model(sampler_type="temperature", temperature=50.0)
    model.set_config({"sampler_type": "greedy"})
    record = recorded("hello")
    out = model.generate(record["ids"], max_new_tokens=8)
    assert out == record["greedy"][: len(out)] and len(out) >= 1


def test_a_load_time_key_after_load_says_it_waits_for_the_next_load():
    model = load_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.set_config({"thread_num": 1, "temperature": 0.5})
    lines = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(lines) == 1 and "thread_num" in lines[0] and "next load()" in lines[0]


def test_context_json_is_merged_at_load_over_an_earlier_set_config(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(MODEL_DIR, folder, ignore=shutil.ignore_patterns("hf"))
    (folder / "context.json").write_text(json.dumps({"b": 3}), encoding="utf-8")
    model = llm.create(folder / "config.json")
    model.set_config({**ORACLE_CONFIG, "jinja": {"context": {"b": 9, "c": 4}}})
    assert model.config.jinja["context"] == {"b": 9, "c": 4}
    model.load()
    assert model.config.jinja["context"] == {"b": 3, "c": 4}
