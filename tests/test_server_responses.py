"""OpenAI's Responses API (POST /v1/responses, GET /v1/responses/{id}) through the `openai` package
and LangChain's ChatOpenAI(use_responses_api=True): plain, streamed (its events, numbered), a
function-call round-trip, text.format json_schema, previous_response_id over the stored
responses, and refusals naming their field.

Truths: the chat route's reply for the same prompt and sampler seed (the API is a translation of
it); transformers' apply_chat_template with the same template, messages and tools for the token
counts; `jsonschema` for the structured reply and a call's arguments; the `openai` package's own
parsing of the events and bodies.
"""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
transformers = pytest.importorskip("transformers")
pytest.importorskip("llguidance")

from mnngpu.apps.server.app import create_app
from mnngpu.apps.server.engine import ServedModel
from mnngpu.apps.server.openai_responses import ResponseStore, Stored
from tests.reference_model import MODEL_DIR, hf_count, load_model
from tests.serving import openai_client, running
from tests.test_server_fields import tools_template

SEED = 11   # the model's sampler seed: a sampled reply repeats, on every route
QUESTION = "Where does the farmer walk?"
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                               "unit": {"type": "string", "enum": ["C", "F"]}},
              "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city.", "parameters": PARAMETERS}
AS_CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                                 "parameters": PARAMETERS}}


@pytest.fixture(scope="module")
def server():
    model = ServedModel(load_model(jinja={"chat_template": tools_template(), "eos": "<|im_end|>"}, seed=SEED), "m")
    with running(create_app(model)) as client:
        yield client, openai_client(client)


def hf_prompt(messages: list[dict], tools: list[dict] | None = None) -> str:
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(MODEL_DIR / "hf" / "tokenizer.json"))
    return tokenizer.apply_chat_template(messages, tools=tools, chat_template=tools_template(), tokenize=False,
                                         add_generation_prompt=True)


def chat_text(server, messages: list[dict], **fields) -> str:
    return server[1].chat.completions.create(model="m", messages=messages, **fields).choices[0].message.content


# ---- replies -------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.9}],
                         ids=["greedy", "sampled", "top_p"])
def test_a_reply_is_the_chat_routes_reply(server, sampling):
    response = server[1].responses.create(model="m", input=QUESTION, max_output_tokens=12, **sampling)
    messages = [{"role": "user", "content": QUESTION}]
    truth = chat_text(server, messages, max_tokens=12, **sampling)
    assert response.output_text == truth and truth
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.usage.input_tokens == hf_count(hf_prompt(messages))
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens


def test_instructions_and_message_items_reach_the_prompt(server):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi.",
                                                                   "annotations": []}]},
             {"role": "developer", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    response = server[1].responses.create(model="m", instructions="Answer in English.", input=items,
                                          max_output_tokens=6, temperature=0)
    chat = [{"role": "system", "content": "Answer in English."}, {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi."}, {"role": "system", "content": "Be brief."},
            {"role": "user", "content": QUESTION}]
    assert response.output_text == chat_text(server, chat, max_tokens=6, temperature=0)
    assert response.usage.input_tokens == hf_count(hf_prompt(chat))
    assert response.instructions == "Answer in English."


def test_max_output_tokens_makes_the_response_incomplete(server):
    response = server[1].responses.create(model="m", input=QUESTION, max_output_tokens=3, temperature=0)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3


# ---- streams ---------------------------------------------------------------------------------------


def test_a_stream_sends_the_responses_events_in_order_and_numbered(server):
    events = list(server[1].responses.create(model="m", input=QUESTION, max_output_tokens=8, temperature=0,
                                             stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    whole = server[1].responses.create(model="m", input=QUESTION, max_output_tokens=8, temperature=0)
    assert text == events[-4].text == events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens == 8


def test_the_stream_helper_reads_the_stream(server):
    with server[1].responses.stream(model="m", input=QUESTION, max_output_tokens=12, temperature=1.0) as stream:
        events = list(stream)
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == events[-5].snapshot == chat_text(
        server, [{"role": "user", "content": QUESTION}], max_tokens=12, temperature=1.0)


# ---- function calls ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_function_call_round_trip(server, stream):
    api = server[1]
    fields = dict(model="m", input="Weather in Paris?", tools=[WEATHER], tool_choice="required",
                  max_output_tokens=300, temperature=0)
    if stream:
        with api.responses.stream(**fields) as events:
            response = events.get_final_response()
    else:
        response = api.responses.create(**fields)
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and all(call.name == "get_weather" and call.call_id.startswith("call_") for call in calls)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), PARAMETERS)
    outputs = [{"type": "function_call_output", "call_id": call.call_id, "output": "21 C"} for call in calls]
    history = [{"role": "user", "content": "Weather in Paris?"},
               *[call.model_dump(exclude_none=True) for call in calls], *outputs]
    answer = api.responses.create(model="m", input=history, tools=[WEATHER], max_output_tokens=4, temperature=0)
    as_chat = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                   "name": call.name, "arguments": json.loads(call.arguments)}} for call in calls]},
               *[{"role": "tool", "content": "21 C", "tool_call_id": call.call_id} for call in calls]]
    truth = hf_prompt(as_chat, tools=[AS_CHAT_TOOL])
    assert "<tool_response>\n21 C\n</tool_response>" in truth
    assert answer.usage.input_tokens == hf_count(truth)


def test_a_named_function_is_called(server):
    response = server[1].responses.create(model="m", input="Weather?", tools=[WEATHER], max_output_tokens=300,
                                          tool_choice={"type": "function", "name": "get_weather"}, temperature=0)
    assert [item.name for item in response.output if item.type == "function_call"] == ["get_weather"]


# ---- structured output ---------------------------------------------------------------------------

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_schema_format_gives_json_valid_against_it(server, stream):
    fields = dict(model="m", input="Describe a person.", max_output_tokens=120, temperature=1.0,
                  text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    if stream:
        with server[1].responses.stream(**fields) as events:
            text = events.get_final_response().output_text
    else:
        text = server[1].responses.create(**fields).output_text
    jsonschema.validate(json.loads(text), PERSON)


def test_a_json_object_format_gives_an_object(server):
    text = server[1].responses.create(model="m", input="A JSON object, please.", max_output_tokens=60,
                                      temperature=0, text={"format": {"type": "json_object"}}).output_text
    assert isinstance(json.loads(text), dict)


# ---- stored responses ----------------------------------------------------------------------------


def test_previous_response_id_continues_the_conversation(server):
    api = server[1]
    first = api.responses.create(model="m", instructions="Be brief.", input=QUESTION, max_output_tokens=6,
                                 temperature=0)
    second = api.responses.create(model="m", previous_response_id=first.id, input="And then?", max_output_tokens=6,
                                  temperature=0)
    chat = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And then?"}]
    assert second.usage.input_tokens == hf_count(hf_prompt(chat))   # the instructions are not inherited
    assert second.output_text == chat_text(server, chat, max_tokens=6, temperature=0)
    assert second.previous_response_id == first.id
    assert api.responses.retrieve(first.id).output_text == first.output_text


def test_an_unknown_or_unstored_response_id_is_refused_by_name(server):
    api = server[1]
    unstored = api.responses.create(model="m", input=QUESTION, max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as refused:
        api.responses.create(model="m", previous_response_id=unstored.id, input="x", max_output_tokens=2)
    assert refused.value.body["param"] == "previous_response_id" and unstored.id in refused.value.body["message"]


def test_the_store_keeps_the_most_recently_used_responses():
    store = ResponseStore(size=2)
    for name in ("a", "b"):
        store.put(name, Stored({"id": name}, []))
    assert store.get("a") is not None   # "a" is now the most recently used
    store.put("c", Stored({"id": "c"}, []))
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None


# ---- refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "param"), [
    ({"input": QUESTION, "messages": []}, "messages"),
    ({"input": QUESTION, "background": True}, "background"),
    ({"input": QUESTION, "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": QUESTION, "temperature": 3}, "temperature"),
    ({"input": []}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content[0].image_url"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": QUESTION, "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": QUESTION, "tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ({"input": QUESTION, "text": {"format": {"type": "json_schema", "name": "x", "schema": []}}}, "text.format.schema"),
    ({"input": QUESTION, "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": QUESTION, "reasoning": {"effort": "high"}}, "reasoning.effort"),   # the model does not think
    ({"input": QUESTION, "reasoning": {"effort": "xhigh"}}, "reasoning.effort"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]},
     "input"),   # the model reads no images
    ({"input": "word " * 3000}, "input"),   # longer than max_all_tokens
])
def test_a_bad_body_gets_a_400_naming_the_field(server, body, param):
    response = server[0].post("/v1/responses", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()


# ---- LangChain -------------------------------------------------------------------------------------


def test_langchains_chat_openai_on_the_responses_api_gets_the_chat_routes_reply(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    url = server[0].base_url
    model = langchain_openai.ChatOpenAI(base_url=f"http://{url.host}:{url.port}/v1", api_key="unused", model="any",
                                        temperature=0, max_tokens=12, max_retries=0, use_responses_api=True)
    reply = model.invoke(QUESTION)
    assert reply.text == chat_text(server, [{"role": "user", "content": QUESTION}], max_tokens=12, temperature=0)
    assert "".join(chunk.text for chunk in model.stream(QUESTION)) == reply.text


# ---- a thinking model ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def thinker():
    """A template whose generation prompt opens the think block (R1's way), and a budget of 3 tokens
    that closes it (serve's --reasoning-budget)."""
    from tests.test_reasoning import R1_STYLE

    model = ServedModel(load_model(jinja={"chat_template": R1_STYLE, "eos": "<|im_end|>"}), "m", reasoning_budget=3)
    with running(create_app(model)) as client:
        yield openai_client(client)


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_comes_back_as_a_reasoning_item_before_the_message(thinker, stream):
    fields = dict(model="m", input=QUESTION, max_output_tokens=12, temperature=0, reasoning={"effort": "high"})
    if stream:
        events = list(thinker.responses.create(**fields, stream=True))
        assert "response.reasoning_text.delta" in [event.type for event in events]
        response = events[-1].response
    else:
        response = thinker.responses.create(**fields)
    chat = thinker.chat.completions.create(model="m", messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=12, temperature=0, reasoning_effort="high")
    message = chat.choices[0].message
    assert message.reasoning_content and message.content is not None
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == message.reasoning_content
    assert response.output_text == message.content
    reasoning_tokens = chat.usage.completion_tokens_details.reasoning_tokens
    assert response.usage.output_tokens_details.reasoning_tokens == reasoning_tokens > 0


def test_an_input_image_reaches_a_vision_model_as_the_chat_routes_image_does():
    """The Qwen2-VL fixture's reply to its image and question is its HF float64 greedy reply."""
    pytest.importorskip("PIL")
    import base64

    from mnngpu import llm
    from tests.test_omni import IMAGE, VISION, expected_reply
    from tests.test_omni import QUESTION as ABOUT_IMAGE

    model = llm.create(VISION)
    model.set_config({"precision": "high", "thread_num": 2, "sampler_type": "greedy"})
    model.load()
    url = "data:image/png;base64," + base64.b64encode(IMAGE.read_bytes()).decode()
    with running(create_app(ServedModel(model, "vision"))) as client:
        response = openai_client(client).responses.create(model="m", max_output_tokens=16, input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": url, "detail": "auto"},
                                         {"type": "input_text", "text": ABOUT_IMAGE}]}])
    assert response.output_text == expected_reply(model)


def test_mnngpu_serve_gives_the_openai_client_mnns_greedy_reply():
    from tests.reference_model import CHAT_PROMPT, CHAT_QUESTION, greedy_reply
    from tests.serving import ServeProcess

    process = ServeProcess("--quiet")
    try:
        response = process.api.responses.create(model="m", input=CHAT_QUESTION, max_output_tokens=8)
        assert response.output_text == greedy_reply(CHAT_PROMPT, 8)[1]
        assert response.usage.input_tokens == hf_count(CHAT_PROMPT)
    finally:
        process.kill()


def test_a_failure_after_the_stream_began_is_an_error_event(monkeypatch):
    from mnngpu.apps.server.choice import Piece
    from mnngpu.apps.server.protocol import ApiError

    model = ServedModel(load_model(), "m")

    def fail_after_a_piece(job, prompt, index):
        job.on_text(Piece(index, "Hello"))
        raise ApiError(400, "the grammar failed", param="response_format")

    monkeypatch.setattr(model, "_run_choice", fail_after_a_piece)
    with running(create_app(model)) as client:
        response = client.post("/v1/responses", json={"input": QUESTION, "max_output_tokens": 4, "stream": True})
    payloads = [json.loads(block.split("data: ", 1)[1]) for block in response.text.strip().split("\n\n")]
    assert response.status_code == 200 and payloads[0]["type"] == "response.created"
    assert payloads[-1] == {"type": "error", "sequence_number": len(payloads) - 1, "code": None,
                            "message": "the grammar failed", "param": "text.format"}
    assert "Hello" in [p.get("delta") for p in payloads]
