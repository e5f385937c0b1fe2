"""Record MNN's rendered chat prompts for a battery of templates and messages.

    python -m tools.record_prompt_reference                 # writes tests/fixtures/prompt_reference.json
    python -m tools.record_prompt_reference --replay FILE --json-out OUT   # MNN's outputs for FILE's cases

Each case is run by MNN's own runtime (`MNN.llm`, from the `mnn` wheel) on a copy of a
fixture model whose llm_config.json, context.json and tokenizer.mtok trailer (the
template, eos and bos a `.mtok` carries) are set to the case's. For each case it records
`llm.apply_chat_template(messages)`; for a single user string it also records the text
MNN's `response()` actually tokenized, which is where `use_template` acts.

The templates are written for this battery in the style of real models' templates
(ChatML, tool calls, reasoning blocks, typed content, bos tokens, macros, comments and
whitespace control). Run it in a subprocess of its own: MNN.llm can crash.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "tests" / "fixtures" / "models" / "qwen2_int4_b64"
DEFAULT_OUT = REPO / "tests" / "fixtures" / "prompt_reference.json"
COPIED_FILES = ("config.json", "llm_config.json", "tokenizer.mtok", "context.json")

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

TOOLS_CHATML = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

REASONING = """{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "user" or message.role == "system" %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

HEADER_STYLE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{#- Pull the system message out so it can go first. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

TURN_STYLE = """{{ bos_token }}{% set ns = namespace(expect='user') %}{% for message in messages %}{% if message['role'] == 'system' %}{% continue %}{% endif %}{% if message['role'] != ns.expect %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% set ns.expect = 'user' %}{% else %}{% set role = message['role'] %}{% set ns.expect = 'assistant' %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"""

INSTRUCT_STYLE = """{{- bos_token }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- endif %}
{%- endfor %}"""

FULLWIDTH_STYLE = """{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}{%- if message['role'] == 'user' %}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"""

TYPED_CONTENT = """{% for message in messages %}<|{{ message['role'] }}|>
{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% elif part['type'] == 'image' %}<image>{% endif %}{% endfor %}{% endif %}<|end|>
{% endfor %}{% if add_generation_prompt %}<|assistant|>
{% endif %}"""

PARTS_ONLY = """{% for message in messages %}[{{ message.role|upper }}]{% for part in message.content %}{{ part.text }}{% endfor %}
{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}"""

MACRO_STYLE = """{%- macro turn(role, text) -%}
<{{ role }}>{{ text }}</{{ role }}>
{%- endmacro -%}
{%- for m in messages -%}
{{ turn(m.role, m.content) }}
{% endfor -%}
{%- if add_generation_prompt -%}<assistant>{%- endif -%}"""

WHITESPACE_GAUNTLET = """Header {# a comment #}
  {% for m in messages %}
    {{ m.role }}: {{ m.content }}   {% if loop.last %}(last){% endif %}
  {%- endfor %}
{%- if add_generation_prompt -%}
   >>> {# keep #}
{% endif %}
{#- a trimmed comment -#}
   tail	{{- '|' -}}	end
"""

UNKNOWN_TAGS = """{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% if loop.index0 == 0 %}{% break %}{% endif %}|{% endfor %}{% raw %}<raw>{% endraw %}"""

VALUES = """{{ 'A' if add_generation_prompt is defined else 'B' }}|{{ messages|length }}|{{ messages[0].content|length }}|{{ messages[0]|tojson }}|{{ messages[0]|string }}|{{ messages[0].content|capitalize }}|{{ messages[0].content|lower }}|{{ messages[0].content|upper }}|{{ messages|map(attribute='role')|tojson }}|{{ messages[9] is defined }}|{{ messages[0]['nope'] is defined }}|{{ messages[0].nope is defined }}|{{ extra|tojson(indent=2) }}|{{ extra }}|{% for k, v in extra|items %}{{ k }}={{ v }};{% endfor %}|{{ messages[0].content.replace('a', '4') }}|{{ messages[0].content.split(' ') | length }}|{{ messages[-1].role }}|{{ (messages|length) - 1 }}|{{ range(3)|tojson }}|{{ missing.deeper.still }}|{{ undefined_function(1) }}|{{ 'x' ~ 5 ~ none }}"""

NUMBERS_AND_ESCAPES = """{{ f }}|{{ g }}|{{ h }}|{{ k }}|{{ m }}|{{ n }}|{{ e }}|{{ z }}|{{ big }}|{{ s|tojson }}|{{ [f, s]|string }}|{{ s }}"""
CONTEXT_NUMBERS = {"f": 0.1, "g": 1e20, "h": 1e21, "k": 123456789.123, "m": 0.000123, "n": 1.5e-7, "e": -2.5e300,
                   "z": -0.0, "big": 12345678901234567890, "s": "tab\tnl\nbell\u0007vt\u000bdel\u007f'q' \"d\" \\ /"}
CONTEXT_EXTRA = {"extra": {"name": "tool", "type": "function", "zeta": [1, 2.5, None, True], "alpha": "é\"\n"}}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                          "parameters": {"type": "object", "required": ["city"],
                                                         "properties": {"city": {"type": "string",
                                                                                 "description": "City name"}}}}}
TOOL_CALL_MESSAGE = {"role": "assistant", "content": "",
                     "tool_calls": [{"type": "function",
                                     "function": {"name": "get_weather", "arguments": {"city": "Hangzhou"}}}]}

USER = [{"role": "user", "content": "Hello there"}]
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]
UNICODE = [{"role": "user", "content": "café 日本語 👍🏽\ttab\nnew line 'quotes' \"double\""}]
THINKING = [
    {"role": "user", "content": "Think first."},
    {"role": "assistant", "content": "<think>\nweighing it up\n</think>\n\nDone."},
    {"role": "user", "content": "Again?"},
]
TOOL_CHAT = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Weather in Hangzhou?"},
    {"role": "json", "content": json.dumps(TOOL_CALL_MESSAGE)},
    {"role": "tool", "content": "{\"temp\": 21}"},
    {"role": "tool", "content": "{\"wind\": 3}"},
    {"role": "user", "content": "Thanks"},
]


def case(name: str, messages, jinja: dict | None = None, **extra) -> dict:
    return {"name": name, "messages": messages, "jinja": jinja, **extra}


CASES = [
    case("chatml_user", USER, {"chat_template": CHATML, "eos": "<|im_end|>"}),
    case("chatml_chat", CHAT, {"chat_template": CHATML, "eos": "<|im_end|>"}),
    case("chatml_unicode", UNICODE, {"chat_template": CHATML}),
    case("chatml_string", "Hello there", {"chat_template": CHATML}),
    case("chatml_string_system_prompt", "Hello there", {"chat_template": CHATML},
         config={"system_prompt": "Be brief."}),
    case("chatml_string_no_template", "Hello there", {"chat_template": CHATML}, config={"use_template": False}),
    case("chatml_string_no_template_with_system", "Hi", {"chat_template": CHATML},
         config={"use_template": False, "system_prompt": "Be brief."}),
    case("tools_plain_chat", CHAT, {"chat_template": TOOLS_CHATML}),
    case("tools_no_system", USER, {"chat_template": TOOLS_CHATML}),
    case("tools_with_calls", TOOL_CHAT, {"chat_template": TOOLS_CHATML, "context": {"tools": [TOOL]}}),
    case("reasoning_history", THINKING, {"chat_template": REASONING}),
    case("reasoning_last_turn", THINKING[:2], {"chat_template": REASONING}),
    case("reasoning_thinking_off_from_context_file", USER, {"chat_template": REASONING},
         context_file={"enable_thinking": False}),
    case("reasoning_structured", [USER[0], {"role": "json", "content": json.dumps(
        {"role": "assistant", "content": "Answer.", "reasoning_content": "\nbecause\n"})}],
         {"chat_template": REASONING}),
    case("header_with_bos_and_system", CHAT, {"chat_template": HEADER_STYLE, "bos": "<|begin_of_text|>"},
         trailer={"bos": "<|begin_of_text|>"}),
    case("header_date_from_context", USER, {"chat_template": HEADER_STYLE,
                                            "context": {"date_string": "01 Jan 2030"}},
         trailer={"bos": "<|begin_of_text|>"}),
    case("header_jinja_bos_is_not_used", USER, {"chat_template": HEADER_STYLE, "bos": "<|begin_of_text|>"}),
    case("turn_alternating", CHAT, {"chat_template": TURN_STYLE}, trailer={"bos": "<bos>"}),
    case("turn_broken_alternation", [CHAT[1], CHAT[1]], {"chat_template": TURN_STYLE}, trailer={"bos": "<bos>"}),
    case("instruct_with_eos", CHAT[1:], {"chat_template": INSTRUCT_STYLE, "eos": "</s>"}, trailer={"bos": "<s>"}),
    case("instruct_system_from_context", USER, {"chat_template": INSTRUCT_STYLE, "eos": "</s>",
                                                "context": {"system_message": "Sys."}}),
    case("instruct_eos_missing_from_jinja", CHAT[1:3], {"chat_template": INSTRUCT_STYLE},
         trailer={"eos": "</s>", "bos": "<s>"}),
    case("fullwidth_reasoning", THINKING, {"chat_template": FULLWIDTH_STYLE}, trailer={"bos": "<｜begin▁of▁sentence｜>"}),
    case("typed_content_both_ways", CHAT[:2], {"chat_template": TYPED_CONTENT}),
    case("typed_content_required", CHAT, {"chat_template": PARTS_ONLY}),
    case("macro", CHAT, {"chat_template": MACRO_STYLE}),
    case("whitespace_gauntlet", CHAT[1:3], {"chat_template": WHITESPACE_GAUNTLET}),
    case("unknown_tags_are_skipped", CHAT[1:3], {"chat_template": UNKNOWN_TAGS}),
    case("values_filters_and_printing", [{"role": "user", "content": "aBc dEf é"}, CHAT[2]],
         {"chat_template": VALUES, "context": CONTEXT_EXTRA}),
    case("printing_numbers_and_escapes", USER, {"chat_template": NUMBERS_AND_ESCAPES, "context": CONTEXT_NUMBERS}),
    case("template_from_tokenizer_file", CHAT[1:3], None, trailer={"template": CHATML, "eos": "<|im_end|>"}),
    case("tokenizer_eos_in_template", USER, None,
         trailer={"template": "{{ messages[0].content }}{{ eos_token }}", "eos": "<|im_end|>"}),
    case("context_without_template_keeps_tokenizer_template", USER, {"context": {"who": "ctx"}},
         trailer={"template": "{{ who }}:{{ messages[0].content }}", "eos": ""}),
    case("no_template_anywhere", CHAT, None),
    case("no_template_string", "just text", None),
]


# --- running MNN ---------------------------------------------------------------------------


def trailer_bytes(template: str, eos: str, flags: int, bos: str) -> bytes:
    """The optional tail of a `.mtok` file: u32 template, u16 eos, u8 flags, u16 bos (lengths first)."""
    def blob(text: str, width: str) -> bytes:
        data = text.encode("utf-8")
        return struct.pack("<" + width, len(data)) + data
    return blob(template, "I") + blob(eos, "H") + struct.pack("<B", flags) + blob(bos, "H")


def current_trailer(model: Path) -> tuple[bytes, int]:
    """The trailer the exporter wrote (from hf/tokenizer_config.json) and its flags byte."""
    tokenizer_config = json.loads((model / "hf" / "tokenizer_config.json").read_text())

    def token(value) -> str:
        return value.get("content", "") if isinstance(value, dict) else (value or "")
    flags = 1 if tokenizer_config.get("clean_up_tokenization_spaces") is True else 0
    return trailer_bytes(tokenizer_config.get("chat_template") or "", token(tokenizer_config.get("eos_token")),
                         flags, token(tokenizer_config.get("bos_token"))), flags


def write_tokenizer(model: Path, folder: Path, trailer: dict) -> None:
    data = (model / "tokenizer.mtok").read_bytes()
    old, flags = current_trailer(model)
    if not data.endswith(old):
        raise SystemExit(f"{model / 'tokenizer.mtok'}: its tail is not the trailer hf/tokenizer_config.json implies")
    new = trailer_bytes(trailer.get("template", ""), trailer.get("eos", ""), flags, trailer.get("bos", ""))
    (folder / "tokenizer.mtok").write_bytes(data[: len(data) - len(old)] + new)


def prepare_model(model: Path, folder: Path, spec: dict) -> None:
    for item in model.iterdir():
        if item.name not in COPIED_FILES and item.name != "hf":
            os.symlink(item, folder / item.name)
    config = json.loads((model / "config.json").read_text())
    config.update({"precision": "high", "memory": "high", "thread_num": 1, "max_new_tokens": 0,
                   **spec.get("config", {})})
    (folder / "config.json").write_text(json.dumps(config))
    llm_config = json.loads((model / "llm_config.json").read_text())
    llm_config.pop("jinja", None)
    if spec["jinja"] is not None:
        llm_config["jinja"] = spec["jinja"]
    (folder / "llm_config.json").write_text(json.dumps(llm_config))
    if "context_file" in spec:
        (folder / "context.json").write_text(json.dumps(spec["context_file"]))
    write_tokenizer(model, folder, spec.get("trailer", {}))


def run_case(model: Path, spec: dict) -> dict:
    import MNN.llm as mnn_llm

    folder = Path(tempfile.mkdtemp(prefix="prompt_case_"))
    try:
        prepare_model(model, folder, spec)
        llm = mnn_llm.create(str(folder / "config.json"))
        llm.load()
        result = {"apply_chat_template": llm.apply_chat_template(spec["messages"])}
        if isinstance(spec["messages"], str):
            result["response_prompt"] = response_prompt(llm, spec["messages"], result["apply_chat_template"])
        return result
    finally:
        shutil.rmtree(folder)


def response_prompt(llm, text: str, templated: str) -> str | None:
    """Which text `response(text)` tokenized: the templated one or the bare one."""
    llm.response(text)  # max_new_tokens is 0: it only prefills, so history holds the prompt alone
    fed = list(llm.context.history_tokens)
    for candidate in (templated, text):
        if list(llm.tokenizer_encode(candidate)) == fed:
            return candidate
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="a fixture model folder with hf/")
    parser.add_argument("--replay", type=Path, help="run the cases of this reference file instead of CASES")
    parser.add_argument("--json-out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    specs = json.loads(args.replay.read_text())["cases"] if args.replay else CASES
    cases = [{**spec, "mnn": run_case(args.model, spec)} for spec in specs]
    record = {"model": args.model.name, "mnn_version": mnn_version(), "cases": cases}
    args.json_out.write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def mnn_version() -> str:
    from importlib.metadata import version

    return version("mnn")


if __name__ == "__main__":
    main()
