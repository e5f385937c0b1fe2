"""The one table of config keys (mnngpu.config.keys): it covers every key MNN reads, docs/formats.md
shows it, a rejected value stops the load naming the key, a warned one draws one warning line."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from mnngpu.config import DEFAULTS, KNOWN_KEYS, ConfigWarning, LlmConfig
from mnngpu.config.keys import KEYS, LOAD_TIME_KEYS, NO_DEFAULT, REJECTED, STATUSES, WARNED, markdown_table
from mnngpu.errors import ConfigError
from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]
QWEN2 = FIXTURES / "qwen2_int4_b64"

# Keys MNN's engine reads (transformers/llm/engine/src/llmconfig.hpp and llm.cpp), listed here by hand
# from the source, apart from the table, so a key dropped from the table fails.
MNN_RUNTIME_KEYS = {
    "prefix_cache_path", "kvcache_mmap", "tmp_path", "use_mmap", "mmap_size", "use_cached_mmap", "attention_mode",
    "quant_qkv", "memory", "power", "dynamic_option", "chunk", "chunk_limits", "attn_scale", "attention_type",
    "attention_mask", "is_mrope", "sliding_window", "cpu_sme2_neon_division_ratio", "cpu_sme_core_num", "async",
    "timeout_ms", "prompt_cache", "enable_debug", "hidden_states", "ple_embed_file", "has_deepstack",
    "ple_embed_scale", "ple_embed_dim", "ple_quant",
}


def test_the_table_covers_every_key_mnn_reads():
    assert set(DEFAULTS) <= set(KEYS)
    assert MNN_RUNTIME_KEYS <= set(KEYS)
    assert KNOWN_KEYS == frozenset(KEYS)
    assert {key.status for key in KEYS.values()} <= set(STATUSES)
    for name, key in KEYS.items():
        assert key.note, name
        assert (key.supported is not None) == (key.status == REJECTED), name


def test_each_default_passes_its_own_check():
    for name, key in KEYS.items():
        if key.default is not NO_DEFAULT and key.check is not None:
            assert key.check[1](key.default), name
        if key.status == REJECTED and key.default is not NO_DEFAULT:
            assert key.supported[1](key.default), name   # MNN's default is a value mnngpu computes


@pytest.mark.parametrize("key, value", [("thread_num", 0), ("precision", "max"), ("chunk_limits", [1]),
                                        ("logit_bias", {"x": 1}), ("seed", -1), ("mllm", [])])
def test_a_value_outside_its_rows_check_names_the_key(key, value):
    config = LlmConfig.load(QWEN2)
    with pytest.raises(ConfigError, match=key):
        config.set_config({key: value})


def test_a_load_time_key_set_after_load_says_it_waits_for_the_next_load():
    from mnngpu import llm
    model = llm.create(QWEN2)
    model.load()
    with pytest.warns(ConfigWarning, match="takes effect at the next load"):
        model.set_config({"thread_num": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        model.set_config({"temperature": 0.5})   # read at every reply: no warning
    assert {"backend_type", "thread_num", "llm_model"} <= LOAD_TIME_KEYS
    assert "temperature" not in LOAD_TIME_KEYS


def test_docs_show_the_same_table():
    text = (ROOT / "docs" / "formats.md").read_text(encoding="utf-8")
    start, end = "<!-- config-keys:start -->\n", "<!-- config-keys:end -->"
    assert text.split(start, 1)[1].split(end, 1)[0] == markdown_table()
    for name, key in KEYS.items():
        row = next(line for line in markdown_table().splitlines() if f"`{name}`" in line)
        assert f"| {key.status} |" in row


def model_with(tmp_path: Path, **llm_config) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({}), encoding="utf-8")
    facts = json.loads((QWEN2 / "llm_config.json").read_text())
    (folder / "llm_config.json").write_text(json.dumps({**facts, **llm_config}), encoding="utf-8")
    return folder


@pytest.mark.parametrize("key, value", [
    ("mrope_axes", 4), ("attention_mask", "glm"),
    ("attention_mask", "glm2"), ("audio_type", "conformer"), ("is_single", False),
    ("ple_quant", [0, 15360, 960, 4, 64]), ("attention_mode", 12), ("quant_qkv", 4),
    ("attention_mode", 3), ("is_embedding", True), ("talker_type", "qwen3_tts"),
])
def test_a_value_that_changes_the_math_is_rejected_at_load(tmp_path, key, value):
    folder = model_with(tmp_path, **{key: value})
    with pytest.raises(ConfigError) as caught:
        LlmConfig.load(folder)
    assert caught.value.field == key
    assert "llm_config.json" in str(caught.value) and key in str(caught.value)


@pytest.mark.parametrize("key, value", [("attention_type", "full"), ("attention_type", "mix"),
                                        ("attention_type", "sliding"), ("attention_mask", "int"),
                                        ("attention_mode", 0), ("attention_mode", 8), ("is_mrope", False),
                                        ("is_mrope", True), ("is_visual", True)])
def test_supported_values_load_quietly(tmp_path, key, value):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        LlmConfig.load(model_with(tmp_path, **{key: value}))


def test_a_talker_loads_with_one_line_saying_speech_output_is_not_supported(tmp_path):
    with pytest.warns(ConfigWarning, match="has_talker.*speech output is not supported") as caught:
        LlmConfig.load(model_with(tmp_path, has_talker=True))
    assert len([w for w in caught if "has_talker" in str(w.message)]) == 1


def test_a_rejected_value_from_set_config_is_refused_and_the_config_kept():
    config = LlmConfig.load(QWEN2)
    with pytest.raises(ConfigError, match="attention_mask"):
        config.set_config({"attention_mask": "glm"})
    assert config.attention_mask == "float"


def test_a_warned_key_warns_once_and_only_off_its_default():
    config = LlmConfig.load(QWEN2)
    warned = "power"
    assert KEYS[warned].status == WARNED
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config.set_config({warned: DEFAULTS[warned]})
        config.set_config({warned: "high"})
        config.set_config({warned: "low"})
    lines = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(lines) == 1 and warned in lines[0] and "\n" not in lines[0]


def test_attn_scale_reaches_the_attention_ops():
    """The exports write attn_scale = 1/sqrt(head_dim) with the op's own scale 0: the same logits as
    no attn_scale at all; another value changes them (the op-level truth is in tests/backend)."""
    from mnngpu import llm

    def logits(**overrides):
        model = llm.create(QWEN2 / "config.json")
        model.set_config({"precision": "high", **overrides})
        model.load()
        return np.asarray(model.forward([1, 2, 3, 4]))

    recorded = json.loads((QWEN2 / "llm_config.json").read_text())["attn_scale"]
    base = logits(attn_scale=recorded)
    np.testing.assert_allclose(logits(attn_scale=0.0), base, rtol=0, atol=1e-5)
    assert np.abs(logits(attn_scale=4 * recorded) - base).max() > 1e-2
