"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) through the `anthropic`
package and LangChain's ChatAnthropic: plain, streamed (both of the client's ways), stop sequences,
max_tokens, top_k, a tool round-trip, count_tokens, and refusals in Anthropic's error shape.

Truths: the chat route's reply for the same prompt and sampler seed (the API is a translation of
it); transformers' apply_chat_template with the same template, messages and tools for the token
counts; `jsonschema` for a tool call's input against the tool's input_schema; the `anthropic`
package's own parsing of the events and bodies.
"""

from __future__ import annotations

import json

import pytest

anthropic = pytest.importorskip("anthropic")
jsonschema = pytest.importorskip("jsonschema")
transformers = pytest.importorskip("transformers")
pytest.importorskip("llguidance")

from mnngpu.apps.server.app import create_app
from mnngpu.apps.server.engine import ServedModel
from tests.reference_model import MODEL_DIR, hf_count, load_model
from tests.serving import WAIT_S, openai_client, running
from tests.test_server_fields import tools_template

SEED = 11   # the model's sampler seed: a sampled reply repeats, on every route
QUESTION = "Where does the farmer walk?"
WEATHER = {"name": "get_weather", "description": "Weather for a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                             "unit": {"type": "string", "enum": ["C", "F"]}},
                            "required": ["city", "unit"], "additionalProperties": False}}
AS_FUNCTION = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                "parameters": WEATHER["input_schema"]}}


@pytest.fixture(scope="module")
def server():
    model = ServedModel(load_model(jinja={"chat_template": tools_template(), "eos": "<|im_end|>"}, seed=SEED), "m")
    with running(create_app(model)) as client:
        url = client.base_url
        yield client, anthropic.Anthropic(base_url=f"http://{url.host}:{url.port}", api_key="unused", max_retries=0,
                                          timeout=WAIT_S), openai_client(client)


def hf_prompt(messages: list[dict], tools: list[dict] | None = None) -> str:
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(MODEL_DIR / "hf" / "tokenizer.json"))
    return tokenizer.apply_chat_template(messages, tools=tools, chat_template=tools_template(), tokenize=False,
                                         add_generation_prompt=True)


def chat_text(server, messages: list[dict], **fields) -> str:
    return server[2].chat.completions.create(model="m", messages=messages, **fields).choices[0].message.content


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


# ---- replies -------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.9}],
                         ids=["greedy", "sampled", "top_p"])
def test_a_reply_is_the_chat_routes_reply(server, sampling):
    messages = [{"role": "user", "content": QUESTION}]
    message = server[1].messages.create(model="m", max_tokens=12, messages=messages, extra_body=sampling)
    truth = chat_text(server, messages, max_tokens=12, **sampling)
    assert text_of(message) == truth and truth
    assert message.role == "assistant" and message.type == "message" and message.id.startswith("msg_")
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert message.usage.input_tokens == hf_count(hf_prompt(messages))


def test_system_text_blocks_and_plain_fields_reach_the_prompt(server):
    system = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Answer in English."}]
    messages = [{"role": "user", "content": [{"type": "text", "text": "Where does "}, {"type": "text",
                                                                                      "text": "the farmer walk?"}]}]
    message = server[1].messages.create(model="m", max_tokens=6, system=system, messages=messages, metadata={
        "user_id": "u"}, extra_body={"temperature": 0}, extra_headers={"anthropic-version": "2023-06-01"})
    chat = [{"role": "system", "content": "Be brief.\nAnswer in English."}, {"role": "user", "content": QUESTION}]
    assert text_of(message) == chat_text(server, chat, max_tokens=6, temperature=0)
    assert message.usage.input_tokens == hf_count(hf_prompt(chat))


def test_max_tokens_ends_the_reply_with_stop_reason_max_tokens(server):
    message = server[1].messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": QUESTION}],
                                        extra_body={"temperature": 0})
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3


def test_top_k_1_samples_the_greedy_reply(server):
    messages = [{"role": "user", "content": QUESTION}]
    greedy = chat_text(server, messages, max_tokens=12, temperature=0)
    sampled = server[1].messages.create(model="m", max_tokens=12, messages=messages, extra_body={"temperature": 1.0})
    assert text_of(sampled) != greedy   # so a top_k that did nothing would fail below
    one = server[1].messages.create(model="m", max_tokens=12, messages=messages,
                                    extra_body={"temperature": 1.0, "top_k": 1})
    assert text_of(one) == greedy


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_ends_the_reply_and_is_named(server, stream):
    messages = [{"role": "user", "content": QUESTION}]
    whole = chat_text(server, messages, max_tokens=12, temperature=0)
    stop = whole[4:7]
    fields = dict(model="m", max_tokens=12, messages=messages, stop_sequences=["\x00never", stop],
                  extra_body={"temperature": 0})
    if stream:
        with server[1].messages.stream(**fields) as events:
            message = events.get_final_message()
    else:
        message = server[1].messages.create(**fields)
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert text_of(message) == whole[:whole.find(stop)]


# ---- streams ---------------------------------------------------------------------------------------


def test_messages_stream_gives_the_same_message(server):
    fields = dict(model="m", max_tokens=12, messages=[{"role": "user", "content": QUESTION}],
                  extra_body={"temperature": 0})
    whole = server[1].messages.create(**fields)
    with server[1].messages.stream(**fields) as events:
        texts = list(events.text_stream)
        streamed = events.get_final_message()
    assert "".join(texts) == text_of(streamed) == text_of(whole) and len(texts) > 1
    assert streamed.stop_reason == whole.stop_reason
    assert (streamed.usage.input_tokens, streamed.usage.output_tokens) == (whole.usage.input_tokens,
                                                                           whole.usage.output_tokens)


def test_stream_true_sends_anthropics_event_sequence(server):
    events = list(server[1].messages.create(model="m", max_tokens=6, messages=[{"role": "user", "content": QUESTION}],
                                            stream=True, extra_body={"temperature": 0}))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == ["content_block_stop",
                                                                                   "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[0].message.usage.input_tokens == hf_count(hf_prompt([{"role": "user", "content": QUESTION}]))
    assert events[-2].delta.stop_reason == "max_tokens" and events[-2].usage.output_tokens == 6


def test_a_streamed_refusal_gets_its_status_before_any_event(server):
    response = server[0].post("/v1/messages", json={"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                    "stream": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"


# ---- tools ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_round_trip(server, stream):
    client = server[1]
    question = {"role": "user", "content": "Weather in Paris?"}
    fields = dict(model="m", max_tokens=300, messages=[question], tools=[WEATHER], tool_choice={"type": "any"},
                  extra_body={"temperature": 0})
    if stream:
        with client.messages.stream(**fields) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**fields)
    assert message.stop_reason == "tool_use"
    calls = [block for block in message.content if block.type == "tool_use"]
    assert calls and all(call.name == "get_weather" and call.id.startswith("toolu_") for call in calls)
    for call in calls:
        jsonschema.validate(call.input, WEATHER["input_schema"])
    results = [{"type": "tool_result", "tool_use_id": call.id, "content": "21 C"} for call in calls]
    history = [question, {"role": "assistant", "content": [block.model_dump(exclude_none=True)
                                                           for block in message.content]},
               {"role": "user", "content": results}]
    answer = client.messages.create(model="m", max_tokens=4, messages=history, tools=[WEATHER],
                                    extra_body={"temperature": 0})
    as_chat = [question, {"role": "assistant", "content": text_of(message), "tool_calls": [
        {"type": "function", "function": {"name": call.name, "arguments": call.input}} for call in calls]},
               *[{"role": "tool", "content": "21 C", "tool_call_id": call.id} for call in calls]]
    truth = hf_prompt(as_chat, tools=[AS_FUNCTION])
    assert "<tool_response>\n21 C\n</tool_response>" in truth
    assert answer.usage.input_tokens == hf_count(truth)


def test_a_named_tool_choice_calls_that_tool(server):
    clock = {"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {
        "type": "integer", "minimum": -12, "maximum": 14}}, "required": ["zone"], "additionalProperties": False}}
    message = server[1].messages.create(model="m", max_tokens=300, messages=[{"role": "user", "content": "Time?"}],
                                        tools=[WEATHER, clock], tool_choice={"type": "tool", "name": "get_time",
                                                                             "disable_parallel_tool_use": True},
                                        extra_body={"temperature": 0})
    calls = [block for block in message.content if block.type == "tool_use"]
    assert [call.name for call in calls] == ["get_time"]
    jsonschema.validate(calls[0].input, clock["input_schema"])


def test_count_tokens_counts_the_prompt_as_transformers_renders_it(server):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    counted = server[1].messages.count_tokens(model="m", messages=messages, system="Use tools.", tools=[WEATHER])
    truth = hf_prompt([{"role": "system", "content": "Use tools."}, *messages], tools=[AS_FUNCTION])
    assert counted.input_tokens == hf_count(truth)
    reply = server[1].messages.create(model="m", max_tokens=1, messages=messages, system="Use tools.", tools=[WEATHER])
    assert reply.usage.input_tokens == counted.input_tokens


# ---- refusals ---------------------------------------------------------------------------------------

USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": USER}, "max_tokens"),
    ({"messages": USER, "max_tokens": 4, "frequency_penalty": 1}, "frequency_penalty"),
    ({"messages": USER, "max_tokens": 4, "temperature": 1.5}, "temperature"),
    ({"messages": USER, "max_tokens": 4, "top_k": 0}, "top_k"),
    ({"messages": USER, "max_tokens": 4, "thinking": {"type": "enabled", "budget_tokens": 2048}},
     "thinking.budget_tokens"),   # the model does not think
    ({"messages": USER, "max_tokens": 4, "thinking": {"type": "between_tools"}}, "thinking.type"),
    ({"messages": USER, "max_tokens": 4, "stop_sequences": ["a", ""]}, "stop_sequences"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "url", "url": "https://example.com/cat.png"}}]}], "max_tokens": 4},
     "messages[0].content[0].source.url"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}], "max_tokens": 4},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "robot", "content": "x"}], "max_tokens": 4}, "messages[0].role"),
    ({"messages": [*USER, {"role": "assistant", "content": "The answer is"}], "max_tokens": 4}, "messages[1]"),
    ({"messages": USER, "max_tokens": 4, "tools": [{"name": "bad name", "input_schema": {}}]}, "tools[0].name"),
    ({"messages": USER, "max_tokens": 4, "tools": [{"type": "web_search_20250305", "name": "w"}]}, "tools[0].type"),
    ({"messages": USER, "max_tokens": 4, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
     "tool_choice.name"),
])
def test_a_bad_body_gets_a_400_in_anthropics_shape_naming_the_field(server, body, param):
    response = server[0].post("/v1/messages", json={"model": "m", **body})
    error = response.json()
    assert response.status_code == 400 and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error" and error["error"]["param"] == param, error
    assert error["error"]["message"] and "function" not in error["error"]["message"]


def test_the_anthropic_package_raises_the_refusal(server):
    with pytest.raises(anthropic.BadRequestError) as refused:
        server[1].messages.create(model="m", max_tokens=4, messages=USER, extra_body={"seed": 1})
    assert refused.value.status_code == 400 and refused.value.body["error"]["param"] == "seed"
    assert "unknown field 'seed'" in refused.value.message


def test_an_image_for_a_model_that_reads_none_is_refused(server):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    response = server[0].post("/v1/messages", json={"messages": [{"role": "user", "content": [image]}],
                                                    "max_tokens": 4})
    assert response.status_code == 400 and "image" in response.json()["error"]["message"]


def test_the_request_is_the_chat_request_it_translates_to(server):
    """A tool_result and a tool_use reach the chat template as the chat route's tool and assistant turns."""
    client = server[0]
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"},
                         {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                                           {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                            "input": {"city": "Paris", "unit": "C"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                       "content": [{"type": "text", "text": "21 C"}]}]}],
            "tools": [WEATHER]}
    counted = client.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]
    chat = [body["messages"][0], {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}]},
            {"role": "tool", "content": "21 C", "tool_call_id": "toolu_1"}]
    assert counted == hf_count(hf_prompt(chat, tools=[AS_FUNCTION]))


# ---- LangChain -------------------------------------------------------------------------------------


def test_langchains_chat_anthropic_gets_the_chat_routes_reply(server):
    langchain_anthropic = pytest.importorskip("langchain_anthropic")
    url = server[0].base_url
    model = langchain_anthropic.ChatAnthropic(model="claude-any", anthropic_api_url=f"http://{url.host}:{url.port}",
                                              api_key="unused", max_tokens=12, temperature=0, max_retries=0)
    reply = model.invoke(QUESTION)
    assert reply.content == chat_text(server, [{"role": "user", "content": QUESTION}], max_tokens=12, temperature=0)
    streamed = "".join(chunk.content if isinstance(chunk.content, str) else "".join(
        part.get("text", "") for part in chunk.content) for chunk in model.stream(QUESTION))
    assert streamed == reply.content


def test_the_body_is_json_the_anthropic_package_reads_whole(server):
    response = server[0].post("/v1/messages", json={"messages": USER, "max_tokens": 3, "temperature": 0},
                              headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    body = response.json()
    assert set(body) == {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
    assert anthropic.types.Message.model_validate(body).content[0].type == "text"
    assert json.loads(json.dumps(body)) == body


# ---- a thinking model ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def thinker():
    """A template whose generation prompt opens the think block (R1's way): the reply starts inside it."""
    from tests.test_reasoning import R1_STYLE

    model = ServedModel(load_model(jinja={"chat_template": R1_STYLE, "eos": "<|im_end|>"}), "m")
    with running(create_app(model)) as client:
        url = client.base_url
        yield anthropic.Anthropic(base_url=f"http://{url.host}:{url.port}", api_key="unused", max_retries=0,
                                  timeout=WAIT_S), openai_client(client)


def chat_split(api, budget: int, max_tokens: int) -> tuple[str | None, str | None, int]:
    choice = api.chat.completions.create(model="m", messages=[{"role": "user", "content": QUESTION}], temperature=0,
                                         max_tokens=max_tokens, extra_body={"thinking_budget_tokens": budget})
    message = choice.choices[0].message
    return message.reasoning_content, message.content, choice.usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("budget", "max_tokens"), [(3, 12), (50, 5)], ids=["closed", "cut-off-inside"])
def test_thinking_comes_back_as_a_thinking_block_before_the_answer(thinker, stream, budget, max_tokens):
    fields = dict(model="m", max_tokens=max_tokens, messages=[{"role": "user", "content": QUESTION}],
                  thinking={"type": "enabled", "budget_tokens": budget}, extra_body={"temperature": 0})
    if stream:
        with thinker[0].messages.stream(**fields) as events:
            kinds = [event.delta.type for event in events if event.type == "content_block_delta"]
            message = events.get_final_message()
        assert "thinking_delta" in kinds
    else:
        message = thinker[0].messages.create(**fields)
    reasoning, content, tokens = chat_split(thinker[1], budget, max_tokens)
    assert reasoning
    assert [block.type for block in message.content] == ["thinking"] + ["text"] * (content is not None)
    assert message.content[0].thinking == reasoning
    assert text_of(message) == (content or "") and message.usage.output_tokens == tokens
    assert message.stop_reason == ("max_tokens" if content is None or tokens == max_tokens else "end_turn")


def test_thinking_disabled_renders_the_template_with_thinking_off():
    """Qwen3's way: enable_thinking false renders an empty think block into the prompt."""
    from tests.test_reasoning import QWEN3_STYLE

    model = ServedModel(load_model(jinja={"chat_template": QWEN3_STYLE, "eos": "<|im_end|>"}), "m")
    with running(create_app(model)) as client:
        messages = [{"role": "user", "content": QUESTION}]
        counts = {kind: client.post("/v1/messages/count_tokens", json={"messages": messages, "thinking": {
            "type": kind}}).json()["input_tokens"] for kind in ("disabled", "adaptive")}
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(MODEL_DIR / "hf" / "tokenizer.json"))
    truth = {switch: hf_count(tokenizer.apply_chat_template(messages, chat_template=QWEN3_STYLE, tokenize=False,
                                                            add_generation_prompt=True, enable_thinking=switch))
             for switch in (False, True)}
    assert truth[False] != truth[True]
    assert counts == {"disabled": truth[False], "adaptive": truth[True]}


def test_an_image_block_reaches_a_vision_model_as_the_chat_routes_image_does():
    """The Qwen2-VL fixture's reply to its image and question is its HF float64 greedy reply."""
    pytest.importorskip("PIL")
    import base64

    from mnngpu import llm
    from tests.test_omni import IMAGE, VISION, expected_reply
    from tests.test_omni import QUESTION as ABOUT_IMAGE

    model = llm.create(VISION)
    model.set_config({"precision": "high", "thread_num": 2, "sampler_type": "greedy"})
    model.load()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(IMAGE.read_bytes()).decode()}}
    with running(create_app(ServedModel(model, "vision"))) as client:
        url = client.base_url
        api = anthropic.Anthropic(base_url=f"http://{url.host}:{url.port}", api_key="unused", max_retries=0,
                                  timeout=WAIT_S)
        message = api.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": [
            image, {"type": "text", "text": ABOUT_IMAGE}]}])
    assert text_of(message) == expected_reply(model)


def test_mnngpu_serve_gives_the_anthropic_client_mnns_greedy_reply():
    from tests.reference_model import CHAT_PROMPT, CHAT_QUESTION, greedy_reply
    from tests.serving import ServeProcess

    process = ServeProcess("--quiet")
    try:
        api = anthropic.Anthropic(base_url=f"http://127.0.0.1:{process.port}", api_key="unused", max_retries=0,
                                  timeout=WAIT_S)
        message = api.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": CHAT_QUESTION}])
        assert text_of(message) == greedy_reply(CHAT_PROMPT, 8)[1]
        assert message.usage.input_tokens == hf_count(CHAT_PROMPT)
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
        response = client.post("/v1/messages", json={"messages": USER, "max_tokens": 4, "stream": True})
    events = [block.split("\n", 1)[0] for block in response.text.strip().split("\n\n")]
    assert response.status_code == 200 and events[0] == "event: message_start" and events[-1] == "event: error"
    error = json.loads(response.text.strip().rsplit("data: ", 1)[1])
    assert error == {"type": "error", "error": {"type": "invalid_request_error", "message": "the grammar failed"}}
