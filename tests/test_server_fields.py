"""Every field an OpenAI client sends works or is refused: the field table against the installed
`openai` package's request types and docs/server.md; refused and unknown fields; inert fields;
prompts as text or token ids; n; penalties and logit_bias; the operations endpoints.

Truths: the `openai` package's TypedDicts for the list of fields; MNN's recorded greedy replies;
a greedy loop written here with OpenAI's penalty formula over mnngpu's own forward logits; the HF
tokenizer and chat template of the fixture's source.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import jinja2
import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from starlette.testclient import TestClient

from mnngpu.apps.server import fields as server_fields
from mnngpu.apps.server.app import create_app
from mnngpu.apps.server.engine import ServedModel
from mnngpu.apps.server.fields import (
    CHAT,
    COMPLETIONS,
    FIELDS,
    IMPLEMENTED,
    INERT,
    REFUSED,
    field_names,
    markdown_table,
)
from mnngpu.apps.server.models import ModelSlot
from tests.reference_model import (
    CHAT_PROMPT,
    CHAT_QUESTION,
    RAW_PROMPT,
    greedy_reply,
    hf_count,
    hf_render,
    hf_tokenizer,
    load_model,
    stop_ids,
)
from tests.serving import openai_client, running

ROOT = Path(__file__).resolve().parents[1]
MODEL = "fixture-model"
MESSAGES = [{"role": "user", "content": CHAT_QUESTION}]
CHAT_BODY = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
COMPLETION = {"model": MODEL, "prompt": RAW_PROMPT, "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    served = ServedModel(load_model(), MODEL)
    with running(create_app(served)) as client:
        yield client, openai_client(client)


@pytest.fixture(scope="module")
def api(server):
    return server[1]


# ---- the table ----------------------------------------------------------------------------------------


def openai_fields(module) -> set[str]:
    hints = typing.get_type_hints(module.CompletionCreateParamsBase)
    return set(hints) | set(typing.get_type_hints(module.CompletionCreateParamsStreaming))


def test_the_table_has_every_field_of_openais_request_types_and_no_other():
    from openai.types import completion_create_params
    from openai.types.chat import completion_create_params as chat_create_params

    assert {name for name, f in FIELDS.items() if CHAT in f.endpoints and not f.extension} == openai_fields(
        chat_create_params)
    assert {name for name, f in FIELDS.items() if COMPLETIONS in f.endpoints} == openai_fields(completion_create_params)
    assert {f.status for f in FIELDS.values()} == {IMPLEMENTED, INERT, REFUSED}
    assert all((f.asks_nothing is not None) == (f.status == REFUSED) for f in FIELDS.values())


# Anthropic's 2.x client dropped these from its request type; older clients send them, newer ones in
# extra_body
ANTHROPIC_SAMPLING = {"temperature", "top_p", "top_k"}


def test_the_table_has_every_field_of_the_messages_and_responses_request_types_and_no_other():
    anthropic = pytest.importorskip("anthropic")
    from openai.types.responses import response_create_params

    messages = anthropic.types.message_create_params
    anthropic_fields = set(typing.get_type_hints(messages.MessageCreateParamsBase)) | set(
        typing.get_type_hints(messages.MessageCreateParamsStreaming))
    messages_api, responses_api = server_fields.MESSAGES, server_fields.RESPONSES
    assert field_names(messages_api) == anthropic_fields | ANTHROPIC_SAMPLING
    counted = typing.get_type_hints(anthropic.types.message_count_tokens_params.MessageCountTokensParams)
    assert set(counted) <= field_names(messages_api)
    responses = set(typing.get_type_hints(response_create_params.ResponseCreateParamsBase)) | set(
        typing.get_type_hints(response_create_params.ResponseCreateParamsStreaming))
    assert field_names(responses_api) == responses
    rows = [f for f in FIELDS.values() if set(f.endpoints) & {messages_api, responses_api}]
    assert all(len(f.endpoints) == 1 for f in rows)   # each API's rows are its own
    assert all((f.asks_nothing is not None) == (f.status == REFUSED) for f in rows)


def test_docs_show_the_same_table():
    text = (ROOT / "docs" / "server.md").read_text(encoding="utf-8")
    start, end = "<!-- request-fields:start -->\n", "<!-- request-fields:end -->"
    assert text.split(start, 1)[1].split(end, 1)[0] == markdown_table()


# A value of each refused field that asks for something the server does not do.
REFUSED_ASKS = {
    "best_of": 3, "suffix": " the end", "functions": [{"name": "f", "parameters": {}}], "function_call": "auto",
    "audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "x"}, "verbosity": "low",
    "web_search_options": {}, "moderation": {"model": "m"},
}
# A value of each refused field that asks for nothing, so it is accepted.
REFUSED_NOTHING = {"best_of": 1, "suffix": "", "functions": [], "function_call": "none", "modalities": ["text"]}
INERT_VALUES = {
    "user": "someone", "safety_identifier": "x", "metadata": {"k": "v"}, "store": True,
    "service_tier": "flex", "prompt_cache_key": "k", "prompt_cache_options": {"mode": "explicit"},
    "prompt_cache_retention": "24h",
}
# Implemented fields whose value here asks for what a reply without them is anyway (one model is
# served here, so any model id picks it).
IMPLEMENTED_NOTHING = {"model": "any-other-name", "response_format": {"type": "text"}, "tools": [],
                       "tool_choice": "none",
                       "parallel_tool_calls": False}


def call(api, name: str, value, **extra):
    endpoint = FIELDS[name].endpoints[0]
    if endpoint == CHAT:
        return api.chat.completions.create(**CHAT_BODY, **extra, extra_body={name: value})
    return api.completions.create(**COMPLETION, **extra, extra_body={name: value})


def test_every_refused_and_inert_field_has_a_value_here():
    openai_rows = {name: f for name, f in FIELDS.items() if set(f.endpoints) & {CHAT, COMPLETIONS}}
    assert set(REFUSED_ASKS) == {name for name, f in openai_rows.items() if f.status == REFUSED}
    assert set(INERT_VALUES) == {name for name, f in openai_rows.items() if f.status == INERT}


@pytest.mark.parametrize("name", sorted(REFUSED_ASKS))
@pytest.mark.parametrize("stream", [False, True])
def test_a_refused_field_gets_a_400_naming_it(api, name, stream):
    with pytest.raises(openai.BadRequestError) as refused:
        call(api, name, REFUSED_ASKS[name], stream=stream)
    assert refused.value.body["param"] == name and refused.value.body["code"] == "unsupported_field"
    assert name in refused.value.body["message"]


def plain_text(api, endpoint: str) -> str:
    if endpoint == CHAT:
        return api.chat.completions.create(**CHAT_BODY).choices[0].message.content
    return api.completions.create(**COMPLETION).choices[0].text


@pytest.mark.parametrize("name", sorted({**REFUSED_NOTHING, **INERT_VALUES, **IMPLEMENTED_NOTHING}))
def test_an_inert_field_or_a_refused_one_that_asks_nothing_changes_nothing(api, name):
    value = {**REFUSED_NOTHING, **INERT_VALUES, **IMPLEMENTED_NOTHING}[name]
    for endpoint in FIELDS[name].endpoints:
        if endpoint == CHAT:
            reply = api.chat.completions.create(**CHAT_BODY, extra_body={name: value}).choices[0].message.content
            truth = greedy_reply(CHAT_PROMPT, 8)[1]
        else:
            reply = api.completions.create(**COMPLETION, extra_body={name: value}).choices[0].text
            truth = greedy_reply(RAW_PROMPT, 8)[1]
        assert reply == truth, (name, endpoint)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {**CHAT_BODY, "top_k": 5}, "top_k"),
    ("/v1/completions", {**COMPLETION, "messages": MESSAGES}, "messages"),
    ("/v1/chat/completions", {**CHAT_BODY, "echo": True}, "echo"),
    ("/v1/chat/completions", {**CHAT_BODY, "messages": [{**MESSAGES[0], "name": "bob"}]}, "messages[0].name"),
    ("/v1/chat/completions", {**CHAT_BODY, "stream": True, "stream_options": {"include_tokens": True}},
     "stream_options.include_tokens"),
    ("/v1/completions", {**COMPLETION, "presence_penalty": 2.5}, "presence_penalty"),
    ("/v1/completions", {**COMPLETION, "logit_bias": {"7": 101}}, "logit_bias.7"),
    ("/v1/completions", {**COMPLETION, "logit_bias": {"99999999": 1}}, "logit_bias"),
    ("/v1/completions", {**COMPLETION, "prompt": [1, "x"]}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": [[1, 2], []]}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": [99999999]}, "prompt"),
    ("/v1/completions", {**COMPLETION, "n": 200}, "n"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 0}, "max_tokens"),
])
def test_an_unknown_field_or_a_bad_value_gets_a_400_naming_it(server, path, body, param):
    response = server[0].post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_a_null_field_counts_as_absent(server):
    response = server[0].post("/v1/chat/completions", json={**CHAT_BODY, "tools": None, "logprobs": None, "n": None})
    assert response.json()["choices"][0]["message"]["content"] == greedy_reply(CHAT_PROMPT, 8)[1]


# ---- prompts and choices ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_prompts_as_text_lists_and_token_ids_each_get_n_choices(api, stream):
    prompts = [RAW_PROMPT, hf_tokenizer().encode(CHAT_PROMPT).ids]
    request = {"model": MODEL, "prompt": prompts, "n": 2, "max_tokens": 8, "temperature": 0}
    if stream:
        texts: dict[int, str] = {}
        finished = {}
        for chunk in api.completions.create(**request, stream=True):
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + choice.text
                finished.update({choice.index: choice.finish_reason} if choice.finish_reason else {})
        assert sorted(finished) == [0, 1, 2, 3]
    else:
        reply = api.completions.create(**request)
        texts = {choice.index: choice.text for choice in reply.choices}
        assert reply.usage.prompt_tokens == hf_count(RAW_PROMPT) + hf_count(CHAT_PROMPT)
        assert reply.usage.completion_tokens == 2 * (len(greedy_reply(RAW_PROMPT, 8)[0])
                                                    + len(greedy_reply(CHAT_PROMPT, 8)[0]))
    first, second = greedy_reply(RAW_PROMPT, 8)[1], greedy_reply(CHAT_PROMPT, 8)[1]
    assert texts == {0: first, 1: first, 2: second, 3: second}


def test_a_list_of_token_id_lists_and_a_list_of_strings_match_their_single_prompts(api):
    ids = hf_tokenizer().encode(RAW_PROMPT).ids
    as_ids = api.completions.create(**{**COMPLETION, "prompt": [ids, ids]})
    as_texts = api.completions.create(**{**COMPLETION, "prompt": [RAW_PROMPT, RAW_PROMPT]})
    truth = greedy_reply(RAW_PROMPT, 8)[1]
    assert [c.text for c in as_ids.choices] == [c.text for c in as_texts.choices] == [truth, truth]
    assert [c.index for c in as_ids.choices] == [0, 1]


def test_n_sampled_choices_differ_and_a_seed_repeats_them_all(api):
    request = dict(**{**CHAT_BODY, "temperature": 1.0}, n=3, seed=5)
    first = [c.message.content for c in api.chat.completions.create(**request).choices]
    again = [c.message.content for c in api.chat.completions.create(**request).choices]
    assert first == again and len(set(first)) == 3


def openai_greedy(model, prompt: list[int], steps: int, presence: float, frequency: float,
                  bias: dict[int, float]) -> list[int]:
    """Greedy decoding with OpenAI's definition: logit += bias; logit -= presence * (c > 0) + frequency * c,
    c counting the tokens generated so far."""
    model.reset()
    logits = np.asarray(model.forward(prompt))[0, -1].astype(np.float64)
    counts: dict[int, int] = {}
    out = []
    for _ in range(steps):
        adjusted = logits.copy()
        for token, amount in bias.items():
            adjusted[token] += amount
        for token, count in counts.items():
            adjusted[token] -= presence + frequency * count
        token = int(np.argmax(adjusted))
        if token in stop_ids():
            break
        out.append(token)
        counts[token] = counts.get(token, 0) + 1
        logits = np.asarray(model.forward([token]))[0, -1].astype(np.float64)
    return out


@pytest.fixture(scope="module")
def truth_model():
    return load_model()


@pytest.mark.parametrize(("presence", "frequency", "bias"), [
    (1.5, 0.0, {}), (0.0, 2.0, {}), (-2.0, 0.0, {}), (0.5, 0.5, "ban the greedy first token"), (0.0, 0.0, "favour x"),
])
def test_penalties_and_logit_bias_follow_openais_definition(api, truth_model, presence, frequency, bias):
    prompt = hf_tokenizer().encode(RAW_PROMPT).ids
    greedy_ids = greedy_reply(RAW_PROMPT, 12)[0]
    if bias == "ban the greedy first token":
        bias = {greedy_ids[0]: -100.0}
    elif bias == "favour x":
        bias = {hf_tokenizer().token_to_id("x"): 100.0}
    truth = openai_greedy(truth_model, prompt, 12, presence, frequency, bias)
    assert truth != greedy_ids   # each case changes the reply, so ignoring the field would fail
    reply = api.completions.create(**{**COMPLETION, "max_tokens": 12}, presence_penalty=presence,
                                   frequency_penalty=frequency, logit_bias={str(t): b for t, b in bias.items()})
    assert reply.choices[0].text == hf_tokenizer().decode(truth)


# ---- operations endpoints -----------------------------------------------------------------------------


def test_health_answers_503_while_the_model_loads_and_200_once_ready():
    slot = ModelSlot()
    client = TestClient(create_app(slot))
    assert client.get("/health").status_code == 503 and client.get("/health").json() == {"status": "loading"}
    refused = client.post("/v1/completions", json=COMPLETION)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_loading"
    slot.ready(ServedModel(load_model(), MODEL))
    assert client.get("/health").json() == {"status": "ok"}
    assert client.post("/v1/completions", json=COMPLETION).json()["choices"][0]["text"] == greedy_reply(RAW_PROMPT, 8)[1]
    slot.stop()
    assert client.get("/health").status_code == 503 and client.get("/health").json() == {"status": "stopping"}
    slot.close()


def test_tokenize_and_detokenize_use_the_models_tokenizer(server):
    client = server[0]
    text = "Hello, world! Où est la gare?"
    tokens = client.post("/tokenize", json={"prompt": text}).json()
    assert tokens["tokens"] == hf_tokenizer().encode(text).ids and tokens["count"] == len(tokens["tokens"])
    chat = client.post("/tokenize", json={"messages": MESSAGES}).json()
    assert chat["tokens"] == hf_tokenizer().encode(CHAT_PROMPT).ids
    assert client.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": text}
    assert client.post("/detokenize", json={"tokens": [-1]}).json()["error"]["param"] == "tokens"
    assert client.post("/tokenize", json={"text": text}).json()["error"]["param"] == "text"
    both = client.post("/tokenize", json={"prompt": text, "messages": MESSAGES})
    assert both.status_code == 400 and both.json()["error"]["param"] == "messages"


def test_tokenizer_info_gives_the_eos_and_the_chat_template_transformers_renders(server):
    info = server[0].get("/tokenizer_info").json()
    assert set(info["eos_token_ids"]) == set(stop_ids())
    assert hf_tokenizer().token_to_id(info["eos_token"]) in stop_ids() | {hf_tokenizer().token_to_id("<|im_end|>")}
    template = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(info["chat_template"])
    assert template.render(messages=MESSAGES, add_generation_prompt=True) == CHAT_PROMPT


# ---- the rows of the "Measured" table ---------------------------------------------------------


def test_each_measured_row_now_gives_the_right_result(server):
    client, api = server
    assert len(api.chat.completions.create(**CHAT_BODY, logprobs=True, top_logprobs=3).choices[0].logprobs.content[0]
               .top_logprobs) == 3
    schema = {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"], "additionalProperties": False}
    json_reply = api.chat.completions.create(**{**CHAT_BODY, "max_tokens": 64}, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}).choices[0].message.content
    assert list(json.loads(json_reply)) == ["x"] and isinstance(json.loads(json_reply)["x"], bool)
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    with pytest.raises(openai.BadRequestError) as no_tools_in_template:   # the fixture's template renders no tools
        api.chat.completions.create(**CHAT_BODY, tools=[tool])
    assert no_tools_in_template.value.body["param"] == "tools"
    plain = plain_text(api, CHAT)
    assert api.chat.completions.create(**CHAT_BODY, presence_penalty=1.5).choices[0].message.content != plain
    first = hf_tokenizer().encode(plain).ids[0]
    assert api.chat.completions.create(**CHAT_BODY, logit_bias={str(first): -100}).choices[0].message.content != plain
    echoed = api.completions.create(model=MODEL, prompt=RAW_PROMPT, echo=True, logprobs=1, max_tokens=1).choices[0]
    assert echoed.text.startswith(RAW_PROMPT) and echoed.logprobs.token_logprobs[0] is None
    assert len(api.chat.completions.create(**CHAT_BODY, n=2).choices) == 2
    assert api.completions.create(**{**COMPLETION, "prompt": [[1, 2, 3]]}).choices[0].finish_reason
    assert len(api.completions.create(**{**COMPLETION, "prompt": ["a", "b"]}).choices) == 2
    assert client.get("/health").status_code == 200
    assert client.post("/tokenize", json={"prompt": "hi"}).status_code == 200


# ---- message roles: developer and tool ----------------------------------------------------------------

WEATHER_CALL = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'}}
TOOL_HISTORY = [
    {"role": "developer", "content": "Answer in one word."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
    {"role": "tool", "content": "21 C", "tool_call_id": "call_1"},
    {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
]
# a template that names the developer role, so developer messages reach it as they are
DEVELOPER_TEMPLATE = ("{% for m in messages %}{% if m.role == 'developer' %}<|im_start|>system\n# Developer\n"
                      "{% else %}<|im_start|>{{ m.role }}\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def as_hf_messages(messages: list[dict], developer_as_system: bool) -> list[dict]:
    """The messages as transformers' templates take them: tool-call arguments as objects, and (for a
    template that has no developer role) developer turns as system ones."""
    converted = []
    for message in messages:
        message = {**message, "content": message["content"] or ""}
        if developer_as_system and message["role"] == "developer":
            message["role"] = "system"
        if "tool_calls" in message:
            message["tool_calls"] = [{**call, "function": {**call["function"], "arguments": json.loads(
                call["function"]["arguments"])}} for call in message["tool_calls"]]
        converted.append(message)
    return converted


def served_tokens(client, messages: list[dict]) -> list[int]:
    response = client.post("/tokenize", json={"messages": messages})
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def test_developer_and_tool_messages_render_as_huggingface_renders_the_fixtures_template(server):
    client, api = server
    truth = hf_render(as_hf_messages(TOOL_HISTORY, developer_as_system=True))
    assert truth.startswith("<|im_start|>system\nAnswer in one word.<|im_end|>\n")
    assert "<|im_start|>tool\n21 C<|im_end|>" in truth
    assert served_tokens(client, TOOL_HISTORY) == hf_tokenizer().encode(truth).ids
    reply = api.chat.completions.create(model=MODEL, messages=TOOL_HISTORY, max_tokens=4, temperature=0)
    assert reply.usage.prompt_tokens == hf_count(truth)


def tools_template() -> str:
    """Qwen2.5's ChatML template with tool calls, as MNN's rendering of it is recorded."""
    cases = json.loads((ROOT / "tests" / "fixtures" / "prompt_reference.json").read_text(encoding="utf-8"))["cases"]
    return next(case for case in cases if case["name"] == "tools_plain_chat")["jinja"]["chat_template"]


@pytest.mark.parametrize(("template", "developer_as_system"), [(None, True), (DEVELOPER_TEMPLATE, False)],
                         ids=["tool-template", "developer-template"])
def test_developer_and_tool_messages_render_as_transformers_renders_other_templates(template, developer_as_system):
    transformers = pytest.importorskip("transformers")
    template = template or tools_template()
    served = ServedModel(load_model(jinja={"chat_template": template}), MODEL)
    client = TestClient(create_app(served))
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(ROOT / "tests" / "fixtures" / "models" /
                                                                  "qwen2_int4_b64" / "hf" / "tokenizer.json"))
    truth = hf.apply_chat_template(as_hf_messages(TOOL_HISTORY, developer_as_system), chat_template=template,
                                   tokenize=False, add_generation_prompt=True)
    assert ("# Developer\nAnswer in one word." in truth) != developer_as_system
    assert served_tokens(client, TOOL_HISTORY) == hf_tokenizer().encode(truth).ids
    reply = client.post("/v1/chat/completions", json={"messages": TOOL_HISTORY, "max_tokens": 2, "temperature": 0})
    assert reply.json()["usage"]["prompt_tokens"] == hf_count(truth)
    served.close()


@pytest.mark.parametrize(("message", "param"), [
    ({"role": "tool", "content": "21 C"}, "messages[0].tool_call_id"),
    ({"role": "user", "content": "x", "tool_call_id": "c"}, "messages[0].tool_call_id"),
    ({"role": "user", "content": "x", "tool_calls": [WEATHER_CALL]}, "messages[0].tool_calls"),
    ({"role": "assistant", "tool_calls": [{**WEATHER_CALL, "function": {"name": "f", "arguments": "[1]"}}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"role": "assistant", "tool_calls": [{**WEATHER_CALL, "type": "code"}]}, "messages[0].tool_calls[0]"),
    ({"role": "assistant", "tool_calls": [{"type": "function", "function": WEATHER_CALL["function"]}]},
     "messages[0].tool_calls[0].id"),
])
def test_a_bad_tool_or_tool_call_message_gets_a_400_naming_the_key(server, message, param):
    response = server[0].post("/v1/chat/completions", json={**CHAT_BODY, "messages": [message]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
