"""Tool calls through `mnngpu serve` and the `openai` client: tools rendered by the model's own chat
template (as transformers renders them), tool_choice none / auto / required / a named function,
the calls parsed into `tool_calls`, whole and streamed.

Truths: transformers' apply_chat_template with the same template and tools; the chat template's
own rendering of an assistant turn with tool calls (what a model trained on it writes), which the
reply parser must read back into the same calls; `jsonschema` for each call's arguments against
the function's parameters.
"""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

from starlette.testclient import TestClient

from mnngpu.apps.server.app import create_app
from mnngpu.apps.server.engine import ServedModel
from mnngpu.apps.server.protocol import parse_chat_request
from mnngpu.apps.server.tool_calls import ToolCallParser
from tests.reference_model import MODEL_DIR, hf_count, load_model
from tests.serving import ServeProcess
from tests.test_server_fields import tools_template

# the keys in the order MNN's tojson writes them, so MNN's and transformers' renderings agree
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                    "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "integer", "maximum": 14, "minimum": -12}},
                   "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, CLOCK]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
MESSAGES = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"}]


def tools_jinja() -> str:
    return json.dumps({"chat_template": tools_template(), "eos": "<|im_end|>"})


@pytest.fixture(scope="module")
def server():
    process = ServeProcess("--quiet", "--config", f"jinja={tools_jinja()}")
    yield process
    process.kill()


def hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(MODEL_DIR / "hf" / "tokenizer.json"))


# ---- the prompt ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served():
    model = ServedModel(load_model(jinja={"chat_template": tools_template(), "eos": "<|im_end|>"}), "m")
    yield model
    model.close()


@pytest.mark.parametrize("tool_choice", ["auto", "required", {"type": "function", "function": {"name": "get_time"}}])
def test_tools_reach_the_template_as_transformers_passes_them(served, tool_choice):
    request = parse_chat_request({"messages": MESSAGES, "tools": TOOLS, "tool_choice": tool_choice})
    truth = hf_tokenizer().apply_chat_template(MESSAGES, tools=TOOLS, chat_template=tools_template(), tokenize=False,
                                               add_generation_prompt=True)
    assert '"name": "get_weather"' in truth and '"name": "get_time"' in truth
    assert served.chat_prompt(request.messages, request) == truth


def test_tool_choice_none_leaves_the_tools_out_of_the_prompt(served):
    request = parse_chat_request({"messages": MESSAGES, "tools": TOOLS, "tool_choice": "none"})
    truth = hf_tokenizer().apply_chat_template(MESSAGES, chat_template=tools_template(), tokenize=False,
                                               add_generation_prompt=True)
    assert served.chat_prompt(request.messages, request) == truth


def test_the_usage_counts_the_prompt_with_its_tools(server):
    truth = hf_tokenizer().apply_chat_template(MESSAGES, tools=TOOLS, chat_template=tools_template(), tokenize=False,
                                               add_generation_prompt=True)
    reply = server.api.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=1)
    assert reply.usage.prompt_tokens == hf_count(truth)


def test_a_template_that_renders_no_tools_refuses_them():
    client = TestClient(create_app(ServedModel(load_model(), "m")))   # the fixture's template has no `tools`
    response = client.post("/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tools"
    assert "jinja.chat_template" in response.json()["error"]["message"]   # it says how to give one that does
    plain = client.post("/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS, "tool_choice": "none",
                                                      "max_tokens": 2})
    assert plain.status_code == 200


# ---- the calls -------------------------------------------------------------------------------------


def whole_calls(server, **fields) -> tuple[list[dict], str]:
    request = {"model": "m", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 300, "temperature": 0, **fields}
    choice = server.api.chat.completions.create(**request).choices[0]
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
             for c in choice.message.tool_calls or []]
    return calls, choice.finish_reason


def streamed_calls(server, **fields) -> tuple[list[dict], str, int]:
    """The calls put together from the deltas as OpenAI's clients do; and how many argument chunks came."""
    calls: dict[int, dict] = {}
    finish, chunks = None, 0
    request = {"model": "m", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 300, "temperature": 0, **fields}
    for chunk in server.api.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                if delta.id is not None:
                    assert delta.index not in calls and delta.type == "function"
                    calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
                calls[delta.index]["arguments"] += delta.function.arguments or ""
                chunks += bool(delta.function.arguments)
    return [calls[i] for i in sorted(calls)], finish, chunks


def check_calls(calls: list[dict], names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call["name"] in names and call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["arguments"]), PARAMETERS[call["name"]])


@pytest.mark.parametrize(("tool_choice", "names"), [
    ("required", {"get_weather", "get_time"}),
    ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
    ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"}),
])
def test_required_and_named_tool_choices_return_calls_whose_arguments_validate(server, tool_choice, names):
    calls, finish = whole_calls(server, tool_choice=tool_choice)
    assert finish == "tool_calls"
    check_calls(calls, names)
    streamed, streamed_finish, chunks = streamed_calls(server, tool_choice=tool_choice)
    assert streamed_finish == "tool_calls" and chunks > 1
    check_calls(streamed, names)
    assert [(c["name"], c["arguments"]) for c in streamed] == [(c["name"], c["arguments"]) for c in calls]


def test_sampled_required_calls_validate(server):
    for seed in range(4):
        calls, finish = whole_calls(server, tool_choice="required", temperature=1.0, seed=seed)
        assert finish == "tool_calls"
        check_calls(calls, {"get_weather", "get_time"})


def test_parallel_tool_calls_false_gives_one_call(server):
    for seed in range(4):
        calls, _ = whole_calls(server, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=seed)
        assert len(calls) == 1


def test_auto_lets_the_model_answer_in_text(server):
    """The fixture model writes no <tool_call>: its reply is plain content, as without tools."""
    choice = server.api.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=8,
                                                temperature=0).choices[0]
    assert choice.message.tool_calls is None and choice.message.content and choice.finish_reason != "tool_calls"


def template_written_calls(calls: list[dict], content: str = "") -> str:
    """What the chat template writes for an assistant turn with these calls: what a model trained on it says."""
    history = [*MESSAGES, {"role": "assistant", "content": content, "tool_calls": [
        {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]}]
    tokenizer = hf_tokenizer()
    whole = tokenizer.apply_chat_template(history, tools=TOOLS, chat_template=tools_template(), tokenize=False)
    prompt = tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, chat_template=tools_template(), tokenize=False,
                                           add_generation_prompt=True)
    return whole[len(prompt):].removesuffix("<|im_end|>\n")


@pytest.mark.parametrize("piece_size", [1, 3, 1000])
@pytest.mark.parametrize("content", ["", "Let me look."])
def test_the_parser_reads_back_the_calls_the_template_writes(piece_size, content):
    calls = [{"name": "get_weather", "arguments": {"city": "Pa\"ris}", "unit": "C"}},
             {"name": "get_time", "arguments": {"zone": -3}}]
    text = template_written_calls(calls, content)
    parser = ToolCallParser(["get_weather", "get_time"])
    deltas = [parser.feed(text[i:i + piece_size]) for i in range(0, len(text), piece_size)] + [parser.finish()]
    assert "".join(d.content for d in deltas) == content
    read: dict[int, dict] = {}
    for delta in (c for d in deltas for c in d.calls):
        entry = read.setdefault(delta.index, {"name": delta.name, "arguments": ""})
        entry["arguments"] += delta.arguments
    assert [(r["name"], json.loads(r["arguments"])) for r in read.values()] == [(c["name"], c["arguments"])
                                                                                  for c in calls]


def test_text_without_a_call_comes_back_as_it_is():
    text = "Not a call: <tool_call> of nothing</tool_call> and <tool_\n\n"
    parser = ToolCallParser(["get_weather"])
    assert parser.feed(text).content + parser.finish().content == text and parser.calls == 0


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_bad_tool_fields_get_a_400_naming_the_field(server, fields, param):
    response = server.api.chat.completions.with_raw_response
    with pytest.raises(openai.BadRequestError) as refused:
        response.create(model="m", messages=MESSAGES, extra_body=fields)
    assert refused.value.body["param"] == param, refused.value.body


def test_a_tool_reply_in_the_history_is_accepted(server):
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", '
                                                                                          '"unit": "C"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
    truth = hf_tokenizer().apply_chat_template(
        [*history[:2], {**history[2], "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}]}, history[3]],
        tools=TOOLS, chat_template=tools_template(), tokenize=False, add_generation_prompt=True)
    assert "<tool_response>\n21 C\n</tool_response>" in truth
    reply = server.api.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=1)
    assert reply.usage.prompt_tokens == hf_count(truth)
