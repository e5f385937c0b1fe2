"""Chat prompts against MNN's own rendering.

tests/fixtures/prompt_reference.json holds what MNN.llm 3.6.1 rendered for a battery of
templates and messages (tools/record_prompt_reference.py). Every case is checked against
that record; when `mnn` is installed the record is re-made live and compared too, and
where jinja semantics agree, HuggingFace transformers' apply_chat_template is a third truth.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mnngpu.errors import ConfigError, InputError
from mnngpu.prompt import Prompt

REPO = Path(__file__).resolve().parent.parent
REFERENCE_FILE = REPO / "tests" / "fixtures" / "prompt_reference.json"
RECORDER = REPO / "tools" / "record_prompt_reference.py"
REFERENCE = json.loads(REFERENCE_FILE.read_text(encoding="utf-8"))
CASES = {case["name"]: case for case in REFERENCE["cases"]}

# Cases whose templates mean the same in plain jinja2 (as HuggingFace renders them) and in
# MNN's engine. The others show where MNN differs; docs/sampling.md explains each.
SAME_AS_HUGGINGFACE = [
    "chatml_user", "chatml_chat", "chatml_unicode", "tools_plain_chat", "tools_no_system", "reasoning_history",
    "reasoning_last_turn", "reasoning_thinking_off_from_context_file", "reasoning_structured",
    "header_with_bos_and_system", "header_date_from_context", "header_jinja_bos_is_not_used",
    "instruct_with_eos", "instruct_system_from_context", "instruct_eos_missing_from_jinja", "fullwidth_reasoning",
    "typed_content_both_ways", "macro",
]


def merged_config(case: dict) -> dict:
    """The config the engine's loader would hand over: config.json keys, jinja, context.json merged in."""
    config = copy.deepcopy(case.get("config", {}))
    if case["jinja"] is not None:
        config["jinja"] = copy.deepcopy(case["jinja"])
    if "context_file" in case:
        config.setdefault("jinja", {}).setdefault("context", {}).update(case["context_file"])
    return config


def prompt_for(case: dict, **overrides) -> Prompt:
    trailer = case.get("trailer", {})
    return Prompt({**merged_config(case), **overrides}, tokenizer_template=trailer.get("template", ""),
                  tokenizer_eos=trailer.get("eos", ""), tokenizer_bos=trailer.get("bos", ""))


def ours(case: dict) -> str:
    """What MNN's llm.apply_chat_template(messages) returns, made by us."""
    if isinstance(case["messages"], str):
        return prompt_for(case, use_template=True).apply_chat_template(case["messages"])
    return prompt_for(case).render(case["messages"])


@pytest.mark.parametrize("name", CASES)
def test_same_text_as_mnn(name):
    case = CASES[name]
    assert ours(case) == case["mnn"]["apply_chat_template"]


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "response_prompt" in c["mnn"]])
def test_apply_chat_template_gives_what_mnns_response_tokenizes(name):
    case = CASES[name]
    assert prompt_for(case).apply_chat_template(case["messages"]) == case["mnn"]["response_prompt"]


def test_the_record_covers_use_template_and_system_prompt():
    responses = {n: c["mnn"]["response_prompt"] for n, c in CASES.items() if "response_prompt" in c["mnn"]}
    assert responses["chatml_string_no_template"] == "Hello there"
    assert responses["chatml_string_system_prompt"].startswith("<|im_start|>system\nBe brief.")


def test_live_mnn_renders_the_recorded_text():
    pytest.importorskip("MNN")
    model = REPO / "tests" / "fixtures" / "models" / REFERENCE["model"]
    if not (model / "llm.mnn").exists():
        pytest.skip(f"fixture model missing: {model}")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "live.json"
        subprocess.run([sys.executable, str(RECORDER), "--model", str(model), "--replay", str(REFERENCE_FILE),
                        "--json-out", str(out)], check=True, capture_output=True, timeout=300)
        live = json.loads(out.read_text(encoding="utf-8"))
    for recorded, fresh in zip(REFERENCE["cases"], live["cases"], strict=True):
        assert fresh["mnn"] == recorded["mnn"], recorded["name"]
        assert ours(fresh) == fresh["mnn"]["apply_chat_template"], recorded["name"]


@pytest.fixture(scope="module")
def hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    tokenizer_file = REPO / "tests" / "fixtures" / "models" / REFERENCE["model"] / "hf" / "tokenizer.json"
    if not tokenizer_file.exists():
        pytest.skip(f"fixture tokenizer missing: {tokenizer_file}")
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file))


@pytest.mark.parametrize("name", SAME_AS_HUGGINGFACE)
def test_same_text_as_huggingface(hf_tokenizer, name):
    case = CASES[name]
    messages = [json.loads(m["content"]) if m["role"] == "json" else m for m in case["messages"]]
    variables = dict(merged_config(case)["jinja"].get("context", {}))
    variables["eos_token"] = case["jinja"].get("eos", "")
    if case.get("trailer", {}).get("bos"):
        variables["bos_token"] = case["trailer"]["bos"]
    expected = hf_tokenizer.apply_chat_template(messages, chat_template=case["jinja"]["chat_template"],
                                                tokenize=False, add_generation_prompt=True, **variables)
    assert ours(case) == expected


# --- behaviour MNN's Python API cannot show -----------------------------------------------------

CHATML = CASES["chatml_user"]["jinja"]["chat_template"]


def test_without_generation_prompt_the_flag_is_undefined():
    prompt = Prompt({"jinja": {"chat_template": "{{ add_generation_prompt is defined }}|" + CHATML}})
    messages = [{"role": "user", "content": "hi"}]
    assert prompt.render(messages, add_generation_prompt=False) == "false|<|im_start|>user\nhi<|im_end|>\n"
    assert prompt.apply_chat_template("hi", add_generation_prompt=True).startswith("true|")


def test_bos_falls_back_to_jinja_bos_without_a_tokenizer_bos():
    config = {"jinja": {"chat_template": "{{ bos_token }}{{ messages[0].content }}", "bos": "<s>"}}
    assert Prompt(config).render([{"role": "user", "content": "x"}]) == "<s>x"
    assert Prompt(config, tokenizer_bos="").render([{"role": "user", "content": "x"}]) == "x"


def test_asr_language_is_a_template_variable_beside_jinja_context():
    """MNN after 3.6.1 adds the config's asr_language to the template's variables (Qwen3-ASR templates)."""
    config = {"jinja": {"chat_template": "{{ asr_language }}:{{ task }}:{{ messages[0].content }}",
                        "context": {"task": "t", "asr_language": "English"}}, "asr_language": "Chinese"}
    assert Prompt(config).render([{"role": "user", "content": "x"}]) == "Chinese:t:x"
    del config["asr_language"]
    assert Prompt(config).render([{"role": "user", "content": "x"}]) == "English:t:x"


def test_messages_are_not_changed():
    messages = [{"role": "user", "content": "hi"}]
    Prompt({"jinja": {"chat_template": "{% for m in messages[0].content %}{% endfor %}"}}).render(messages)
    assert messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("messages", [[{"content": "no role"}], ["just a string"], 42])
def test_bad_messages_raise_input_error(messages):
    with pytest.raises(InputError):
        Prompt({"jinja": {"chat_template": CHATML}}).render(messages)


@pytest.mark.parametrize(("config", "field"), [
    ({"jinja": {"chat_template": "{% if %}"}}, "jinja.chat_template"),
    ({"jinja": {"chat_template": "{{ messages "}}, "jinja.chat_template"),
    ({"jinja": {"chat_template": 5}}, "jinja.chat_template"),
    ({"jinja": "template"}, "jinja"),
    ({"use_template": "yes"}, "use_template"),
])
def test_bad_config_raises_config_error(config, field):
    with pytest.raises(ConfigError) as error:
        Prompt(config)
    assert error.value.field == field


def test_render_failures_name_the_template():
    prompt = Prompt({"jinja": {"chat_template": "{{ messages[0].content + 1 }}"}})
    with pytest.raises(ConfigError) as error:
        prompt.render([{"role": "user", "content": "x"}])
    assert error.value.field == "jinja.chat_template"


def test_the_sandbox_holds():
    prompt = Prompt({"jinja": {"chat_template": "{{ messages.__class__.__mro__ }}"}})
    assert prompt.render([{"role": "user", "content": "x"}]) == ""
