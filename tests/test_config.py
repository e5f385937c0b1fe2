"""LlmConfig: merge order, MNN's defaults, base_dir, context.json, set_config, typed getters, errors.

The expected defaults are MNN's (transformers/llm/engine/src/llmconfig.hpp), written out here by
hand so that a changed default in config.py fails a test. The real keys come from fixture exports
made by MNN's own exporter.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from mnngpu.config import KNOWN_BACKENDS, ConfigWarning, LlmConfig, deep_merge
from mnngpu.errors import ConfigError

FIXTURES = Path(__file__).parent / "fixtures" / "models"
QWEN2 = FIXTURES / "qwen2_int4_b64"


def write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def make_model(folder: Path, config: dict, llm_config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", config)
    if llm_config is not None:
        write_json(folder / "llm_config.json", llm_config)
    return folder


@pytest.fixture
def qwen2(tmp_path: Path) -> Path:
    """A copy of a real export's two config files (the binaries are not needed here)."""
    folder = tmp_path / "qwen2"
    folder.mkdir()
    for name in ("config.json", "llm_config.json"):
        shutil.copy(QWEN2 / name, folder / name)
    return folder


def load_quietly(path) -> LlmConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        return LlmConfig.load(path)


def assert_names(error: ConfigError, file: str | Path, key: str) -> None:
    message = str(error)
    assert str(file) in message
    assert key in message
    assert error.field == key
    assert error.path is not None and error.path.endswith(str(file))


# ---- real exports --------------------------------------------------------------------------

@pytest.mark.parametrize("model", sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file()))
def test_every_fixture_loads_without_warnings(model: str) -> None:
    folder = FIXTURES / model
    cfg = load_quietly(folder)
    config = json.loads((folder / "config.json").read_text())
    llm_config = json.loads((folder / "llm_config.json").read_text())
    assert cfg.hidden_size == llm_config["hidden_size"]
    assert cfg.layer_nums == llm_config["layer_nums"]
    assert cfg.model_type == llm_config["model_type"]
    assert cfg.jinja["chat_template"] == llm_config["jinja"]["chat_template"]
    assert cfg.tokenizer_file == config["tokenizer_file"]
    assert cfg.model_path == folder.resolve() / config["llm_model"]
    assert cfg.weight_path == folder.resolve() / config["llm_weight"]
    assert cfg.embedding_rows_path.is_file()


def test_real_export_values(qwen2: Path) -> None:
    cfg = load_quietly(qwen2)
    assert cfg.base_dir == qwen2.resolve()
    assert cfg.backend_type == "cpu" and cfg.thread_num == 4
    assert cfg.precision == "low" and cfg.memory == "low"
    assert cfg.sampler_type == "mixed"
    assert cfg.get("temperature") == 0.8
    assert cfg.tokenizer_file == "tokenizer.mtok"
    assert cfg.embedding_path == qwen2.resolve() / "embeddings_bf16.bin"
    assert cfg.attention_mask == "float"
    assert cfg.attn_scale == pytest.approx(0.1767766952966369)
    assert cfg.tie_embeddings is None
    assert cfg.jinja["eos"] == "<|im_end|>"
    assert cfg.jinja["context"] == {}


def test_embed_bit_export_names_its_embedding_file() -> None:
    folder = FIXTURES / "qwen3_embed_int4"
    cfg = load_quietly(folder)
    assert cfg.embedding_path.name == "embeddings_int4.bin"
    assert cfg.tie_embeddings[0] == 0  # rows are in the embedding file, not in llm.mnn.weight
    assert cfg.embedding_rows_path == cfg.embedding_path


def test_tied_export_reads_rows_from_the_weight_file() -> None:
    cfg = load_quietly(FIXTURES / "llama_tied_int4")
    assert cfg.tie_embeddings is not None and cfg.tie_embeddings[0] > 0
    assert cfg.tie_embeddings[3] == 4 and cfg.tie_embeddings[4] == 64
    assert cfg.embedding_rows_path == cfg.weight_path


def test_loading_does_not_write_to_the_model_folder(qwen2: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in qwen2.iterdir()}
    cfg = load_quietly(qwen2)
    cfg.set_config({"thread_num": 1, "tmp_path": "cache"})
    assert {p.name: p.stat().st_mtime_ns for p in qwen2.iterdir()} == before


# ---- merge order ---------------------------------------------------------------------------

def test_llm_config_wins_over_config_json(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", {"hidden_size": 64, "thread_num": 2},
                        {"hidden_size": 128, "layer_nums": 3})
    cfg = load_quietly(folder)
    assert cfg.hidden_size == 128
    assert cfg.layer_nums == 3
    assert cfg.thread_num == 2


def test_objects_merge_deeply(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", {"jinja": {"bos": "<s>", "eos": "</s>"}},
                        {"jinja": {"eos": "<|im_end|>", "chat_template": "{{ x }}"}})
    jinja = load_quietly(folder).jinja
    assert jinja == {"bos": "<s>", "eos": "<|im_end|>", "chat_template": "{{ x }}", "context": {}}


def test_deep_merge_replaces_non_objects_and_leaves_inputs_alone() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    over = {"a": {"c": [3]}, "d": {"e": 2}}
    assert deep_merge(base, over) == {"a": {"b": 1, "c": [3]}, "d": {"e": 2}}
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 1}


def test_llm_config_key_names_the_second_file(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", {"llm_config": "facts.json"})
    write_json(folder / "facts.json", {"hidden_size": 96})
    assert load_quietly(folder).hidden_size == 96


def test_missing_llm_config_warns_and_falls_back_to_defaults(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", {})
    with pytest.warns(ConfigWarning, match="llm_config.json"):
        cfg = LlmConfig.load(folder)
    assert cfg.hidden_size == 4096 and cfg.layer_nums == 32


# ---- defaults ------------------------------------------------------------------------------

def test_mnn_defaults(tmp_path: Path) -> None:
    cfg = load_quietly(make_model(tmp_path / "m", {}, {}))
    base = tmp_path.resolve() / "m"
    assert (cfg.backend_type, cfg.thread_num, cfg.precision, cfg.power, cfg.memory) == \
        ("cpu", 4, "low", "normal", "low")
    assert (cfg.max_new_tokens, cfg.max_all_tokens) == (512, 2048)
    assert (cfg.reuse_kv, cfg.all_logits, cfg.use_template, cfg.system_prompt) == (False, False, True, "")
    assert (cfg.use_mmap, cfg.kvcache_mmap, cfg.dynamic_option, cfg.attention_mode) == (False, False, 0, 8)
    assert (cfg.tmp_path, cfg.prefix_cache_path) == ("", "prefixcache")
    assert (cfg.hidden_size, cfg.layer_nums) == (4096, 32)
    assert (cfg.attention_mask, cfg.attention_type) == ("int", "full")
    assert cfg.attn_scale is None and cfg.tie_embeddings is None
    assert cfg.sampler_type == "mixed"
    assert cfg.mixed_samplers == ["topK", "tfs", "typical", "topP", "min_p", "temperature"]
    assert (cfg.speculative_type, cfg.draft_predict_length, cfg.ngram_match_maxlen) == ("", 3, 4)
    assert cfg.model_path == base / "llm.mnn"
    assert cfg.weight_path == base / "llm.mnn.weight"
    assert cfg.tokenizer_file == "tokenizer.txt"
    assert cfg.embedding_path == base / "embeddings_bf16.bin"
    assert cfg.embedding_rows_path == cfg.embedding_path
    assert cfg.mtp_model_path == base / "mtp.mnn"
    assert cfg.eagle_model_path == base / "eagle.mnn"
    assert cfg.jinja == {"context": {}}
    assert cfg.get("temperature") is None  # get() is raw: MNN's defaults are not filled in
    assert cfg.value("temperature") == 1.0


def test_quant_qkv_is_the_fallback_for_attention_mode(tmp_path: Path) -> None:
    assert load_quietly(make_model(tmp_path / "a", {"quant_qkv": 0}, {})).attention_mode == 0
    both = make_model(tmp_path / "b", {"quant_qkv": 0, "attention_mode": 16}, {})
    assert load_quietly(both).attention_mode == 16


def test_tie_embeddings_object_form(tmp_path: Path) -> None:
    tie = {"weight_offset": 10, "alpha_offset": 20, "alpha_size": 8, "quant_bit": 4, "quant_block": 32,
           "alpha_dtype": "fp16"}
    cfg = load_quietly(make_model(tmp_path / "m", {}, {"tie_embeddings": tie}))
    assert cfg.tie_embeddings == [10, 20, 8, 4, 32, 1]


# ---- base_dir ------------------------------------------------------------------------------

def test_base_dir_is_the_folder_of_config_json(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", {"llm_model": "x.mnn"}, {})
    for path in (folder, folder / "config.json"):
        cfg = load_quietly(path)
        assert cfg.base_dir == folder.resolve()
        assert cfg.model_path == folder.resolve() / "x.mnn"


def test_absolute_base_dir_moves_every_file(tmp_path: Path) -> None:
    weights = make_model(tmp_path / "weights", {}, {"hidden_size": 80})
    folder = make_model(tmp_path / "cfg", {"base_dir": str(weights)})
    cfg = load_quietly(folder / "config.json")
    assert cfg.base_dir == weights.resolve()
    assert cfg.hidden_size == 80  # llm_config.json is read from base_dir
    assert cfg.model_path == weights.resolve() / "llm.mnn"


def test_relative_base_dir_is_taken_from_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    # MNN joins base_dir to file names as a plain string, so a relative one means the cwd.
    make_model(tmp_path / "weights", {}, {"hidden_size": 72})
    folder = make_model(tmp_path / "cfg", {"base_dir": "weights"})
    monkeypatch.chdir(tmp_path)
    cfg = load_quietly(folder)
    assert cfg.base_dir == (tmp_path / "weights").resolve()
    assert cfg.hidden_size == 72


def test_a_bare_mnn_path_stands_for_its_model_and_weight(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", {"thread_num": 1}, {"hidden_size": 48})
    (folder / "model.mnn").write_bytes(b"")
    cfg = load_quietly(folder / "model.mnn")
    assert cfg.model_path == folder.resolve() / "model.mnn"
    assert cfg.weight_path == folder.resolve() / "model.mnn.weight"
    assert cfg.hidden_size == 48
    assert cfg.thread_num == 4  # config.json is not read for a bare .mnn path


def test_set_config_cannot_move_base_dir(qwen2: Path, tmp_path: Path) -> None:
    cfg = load_quietly(qwen2)
    with pytest.warns(ConfigWarning, match="base_dir"):
        cfg.set_config({"base_dir": str(tmp_path)})
    assert cfg.base_dir == qwen2.resolve()


# ---- context.json --------------------------------------------------------------------------

def test_context_json_merges_into_jinja_context(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", {}, {"jinja": {"chat_template": "t", "context": {"a": 1, "b": 2}}})
    write_json(folder / "context.json", {"b": 3, "enable_thinking": False})
    cfg = load_quietly(folder)
    assert cfg.jinja["context"] == {"a": 1, "b": 2}  # as in MNN, merged only when the model loads
    cfg.merge_context_file()
    jinja = cfg.jinja
    assert jinja["context"] == {"a": 1, "b": 3, "enable_thinking": False}
    assert jinja["chat_template"] == "t"


def test_context_file_key_renames_it(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", {"context_file": "user.json"}, {})
    write_json(folder / "user.json", {"tools": []})
    cfg = load_quietly(folder)
    cfg.merge_context_file()
    assert cfg.jinja["context"] == {"tools": []}
    assert cfg.context_path == folder.resolve() / "user.json"


# ---- set_config ----------------------------------------------------------------------------

def test_set_config_overrides_deeply_from_json_or_dict(qwen2: Path) -> None:
    cfg = load_quietly(qwen2)
    cfg.set_config('{"thread_num": 2, "precision": "high", "jinja": {"context": {"x": 1}}}')
    cfg.set_config({"max_new_tokens": 7})
    assert (cfg.thread_num, cfg.precision, cfg.max_new_tokens) == (2, "high", 7)
    assert cfg.jinja["context"] == {"x": 1}
    assert cfg.jinja["eos"] == "<|im_end|>"  # untouched sibling survives the deep merge
    assert cfg.hidden_size == 128


def test_set_config_overrides_llm_config_json_too(qwen2: Path) -> None:
    cfg = load_quietly(qwen2)
    cfg.set_config({"attention_mask": "int"})
    assert cfg.attention_mask == "int"


def test_bad_set_config_is_rejected_and_leaves_the_config_unchanged(qwen2: Path) -> None:
    cfg = load_quietly(qwen2)
    with pytest.raises(ConfigError) as info:
        cfg.set_config({"thread_num": 0, "max_new_tokens": 5})
    assert "set_config()" in str(info.value) and info.value.field == "thread_num"
    assert (cfg.thread_num, cfg.max_new_tokens) == (4, 512)


def test_set_config_bad_json(qwen2: Path) -> None:
    cfg = load_quietly(qwen2)
    with pytest.raises(ConfigError, match="not valid JSON"):
        cfg.set_config('{"thread_num": 2')
    with pytest.raises(ConfigError, match="JSON object"):
        cfg.set_config("[1]")


def test_raw_is_a_copy(qwen2: Path) -> None:
    cfg = load_quietly(qwen2)
    cfg.raw["thread_num"] = 99
    cfg.get("jinja")["eos"] = "changed"
    assert cfg.thread_num == 4 and cfg.jinja["eos"] == "<|im_end|>"


# ---- errors --------------------------------------------------------------------------------

def test_missing_config_json_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found") as info:
        LlmConfig.load(tmp_path)
    assert info.value.path == str(tmp_path / "config.json")


@pytest.mark.parametrize(("file", "content", "expected"), [
    ("config.json", b"{thread_num: 4}", "not valid JSON"),
    ("config.json", b'"cpu"', "JSON object"),
    ("llm_config.json", b"\xff\xfe garbage", "not UTF-8"),
    ("llm_config.json", b'{"hidden_size": 64,}', "not valid JSON"),
    ("context.json", b"[1, 2]", "JSON object"),
])
def test_unreadable_file_is_named(tmp_path: Path, file: str, content: bytes, expected: str) -> None:
    folder = make_model(tmp_path / "m", {}, {})
    (folder / file).write_bytes(content)
    with pytest.raises(ConfigError, match=expected) as info:
        LlmConfig.load(folder).merge_context_file()  # context.json is read when the model loads
    assert info.value.path == str(folder / file)


def test_the_example_message(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", {"thread_num": "four"}, {})
    with pytest.raises(ConfigError) as info:
        LlmConfig.load(folder)
    assert str(info.value) == f'{folder / "config.json"}: thread_num: expected a positive integer, got "four"'


BAD_VALUES = [
    ("thread_num", 0, "positive integer"),
    ("thread_num", 2.5, "positive integer"),
    ("thread_num", True, "positive integer"),
    ("precision", "fp16", "one of ['low', 'normal', 'high']"),
    ("memory", "max", "one of ['low', 'normal', 'high']"),
    ("power", 1, "one of ['low', 'normal', 'high']"),
    ("max_new_tokens", -1, "integer >= 0"),
    ("max_all_tokens", 0, "integer >= 1"),
    ("backend_type", 3, "a string"),
    ("sampler_type", "beam", "one of"),
    ("mixed_samplers", ["topK", "nucleus"], "sampler names"),
    ("reuse_kv", "yes", "true or false"),
    ("use_mmap", 1, "true or false"),
    ("temperature", "hot", "a number"),
    ("tmp_path", None, "a string"),
    ("speculative_type", "medusa", "one of"),
    ("logit_bias", {"x": 1.0}, "token id"),
    ("banned_tokens", [1, "2"], "list of integers"),
]


@pytest.mark.parametrize(("key", "value", "expected"), BAD_VALUES)
def test_bad_value_in_config_json_names_file_and_key(tmp_path: Path, key, value, expected) -> None:
    folder = make_model(tmp_path / "m", {key: value}, {})
    with pytest.raises(ConfigError) as info:
        LlmConfig.load(folder)
    assert_names(info.value, "config.json", key)
    assert expected in str(info.value)
    assert json.dumps(value) in str(info.value)


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("hidden_size", "64", "positive integer"),
    ("layer_nums", 0, "positive integer"),
    ("attention_type", "local", "one of"),
    ("attn_scale", "0.1", "a number"),
    ("tie_embeddings", [1, 2, 3], "at least 5 integers"),
    ("model_type", ["qwen2"], "a string"),
])
def test_bad_value_in_llm_config_json_names_that_file(tmp_path: Path, key, value, expected) -> None:
    folder = make_model(tmp_path / "m", {}, {key: value})
    with pytest.raises(ConfigError) as info:
        LlmConfig.load(folder)
    assert_names(info.value, "llm_config.json", key)
    assert expected in str(info.value)


def test_bad_jinja_names_the_nested_key(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", {}, {"jinja": {"chat_template": 5}})
    with pytest.raises(ConfigError) as info:
        LlmConfig.load(folder)
    assert_names(info.value, "llm_config.json", "jinja.chat_template")
    folder = make_model(tmp_path / "n", {}, {"jinja": "chatml"})
    with pytest.raises(ConfigError) as info:
        LlmConfig.load(folder)
    assert_names(info.value, "llm_config.json", "jinja")


def test_error_blames_the_file_whose_value_won(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", {"layer_nums": 2}, {"layer_nums": -2})
    with pytest.raises(ConfigError) as info:
        LlmConfig.load(folder)
    assert_names(info.value, "llm_config.json", "layer_nums")


def test_non_string_file_name_is_an_error(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", {"llm_config": 1})
    with pytest.raises(ConfigError) as info:
        LlmConfig.load(folder)
    assert_names(info.value, "config.json", "llm_config")


def test_unknown_key_warns_with_file_and_key(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", {"max_new_token": 10}, {})
    with pytest.warns(ConfigWarning, match=r"config\.json: max_new_token: not a key MNN reads"):
        LlmConfig.load(folder)


def test_backend_validation(qwen2: Path) -> None:
    assert KNOWN_BACKENDS == ("cpu", "opencl", "vulkan", "cuda")
    cfg = load_quietly(qwen2)
    cfg.validate_backend()
    cfg.set_config({"backend_type": "metal"})  # any string passes the load-time check
    with pytest.raises(ConfigError, match=r"one of \['cpu', 'opencl', 'vulkan', 'cuda'\]") as info:
        cfg.validate_backend()
    assert info.value.field == "backend_type" and info.value.path == "set_config()"


# ---- against MNN's own LlmConfig (MNN.llm in a subprocess: it can segfault) ----------------

MNN_DUMP = """
import json, sys
import MNN.llm as mnn_llm
config_path, overrides, do_load = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
llm = mnn_llm.create(config_path)
llm.set_config(overrides)  # MNN.llm's wrapper takes a dict and serializes it itself
if do_load:
    llm.load()  # Llm::load merges context.json
print("DUMP" + llm._c_obj.dump_config())
"""


def mnn_dump_config(config_path: Path, overrides: dict, load: bool, cwd: Path) -> dict:
    pytest.importorskip("MNN")
    done = subprocess.run([sys.executable, "-c", MNN_DUMP, str(config_path), json.dumps(overrides),
                           "1" if load else "0"], check=False, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("DUMP"))
    return json.loads(line[len("DUMP"):])


def test_merge_matches_mnn_on_a_real_export(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    for name in ("llm.mnn", "llm.mnn.weight", "tokenizer.mtok", "embeddings_bf16.bin", "llm_config.json"):
        shutil.copy(QWEN2 / name, folder / name)
    config = json.loads((QWEN2 / "config.json").read_text())
    config.update({"attention_mask": "int", "jinja": {"bos": "<s>", "context": {"a": 1, "b": 2}}})
    write_json(folder / "config.json", config)
    write_json(folder / "context.json", {"b": 3, "enable_thinking": False})
    overrides = {"thread_num": 1, "precision": "high", "mixed_samplers": ["topK", "temperature"],
                 "jinja": {"context": {"b": 9, "c": 4}}}

    expected = mnn_dump_config(folder / "config.json", overrides, load=True, cwd=tmp_path)
    cfg = load_quietly(folder / "config.json")
    cfg.set_config(overrides)
    cfg.merge_context_file()  # what Llm.load does
    assert cfg.raw == expected
    assert expected["attention_mask"] == "float"  # the merge really had something to decide
    # context.json, merged at load, wins over the set_config made before it
    assert expected["jinja"]["context"] == {"a": 1, "b": 3, "c": 4, "enable_thinking": False}


def test_relative_base_dir_matches_mnn(tmp_path: Path, monkeypatch) -> None:
    make_model(tmp_path / "weights", {}, {"hidden_size": 72, "layer_nums": 3})
    folder = make_model(tmp_path / "cfg", {"base_dir": "weights/", "thread_num": 2})
    expected = mnn_dump_config(folder / "config.json", {}, load=False, cwd=tmp_path)
    monkeypatch.chdir(tmp_path)
    cfg = load_quietly(folder / "config.json")
    assert cfg.raw == expected
    assert cfg.hidden_size == 72


RUNTIME_KEYS = ("backend_type", "thread_num", "precision", "power", "memory")


def caught_config_warnings(action) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action()
    return [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


def test_a_section_of_the_folder_tunes_a_runtime_quietly_and_blames_its_source(tmp_path: Path) -> None:
    from mnngpu.config import CONFIG_FLAG

    folder = make_model(tmp_path / "m", {"mllm": {"thread_num": 2, "precision": "high", "memory": "high"}},
                        {"hidden_size": 64})
    cfg = load_quietly(folder)
    vision = None

    def section() -> None:
        nonlocal vision
        vision = cfg.section_config("mllm", RUNTIME_KEYS)
    assert caught_config_warnings(section) == []   # the folder's own tuning of MNN's runtime
    assert (vision.thread_num, vision.precision, vision.memory) == (2, "high", "high")
    assert cfg.thread_num == 4                      # the LLM's own runtime is left alone

    cfg.set_config({"mllm": {"memory": "normal"}})
    want = ("set_config(): mllm.memory: \"normal\" has no effect in mnngpu: MNN's weight and activation storage "
            "choice (memory and speed)")
    assert caught_config_warnings(lambda: cfg.section_config("mllm", RUNTIME_KEYS)) == [want]
    cfg.set_config({"mllm": {"power": "high"}}, source=CONFIG_FLAG)
    warned = caught_config_warnings(lambda: cfg.section_config("mllm", RUNTIME_KEYS))
    assert any(text.startswith('mllm.power: "high" has no effect') and text.endswith("; set by --config")
               for text in warned), warned
    cfg.set_config({"mllm": {"thread_num": 0}}, source=CONFIG_FLAG)
    with pytest.raises(ConfigError) as info:
        cfg.section_config("mllm", RUNTIME_KEYS)
    assert str(info.value) == "mllm.thread_num: expected a positive integer, got 0"
