"""Thinking models over the server: the split into reasoning_content and content (non-streamed
and streamed), a reply cut off inside its block, the budget that closes it, chat_template_kwargs
and reasoning_effort reaching the template, --reasoning-format none, and the 400s.

A random-weight model does not think on its own, so logit_bias makes it write one token over and
over (inside a block the template opened, or the start marker itself where that is one token).
Truths: the same request to a server that does not split (reasoning_format "none") and a
reference parser written here (one regex over the whole text); the tokens themselves, from
logprobs; transformers' rendering of the template, counted by the HF tokenizer.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from mnngpu.apps.server.app import create_app
from mnngpu.apps.server.engine import ServedModel
from tests.reference_model import MODEL_DIR, ORACLE_CONFIG, hf_count, load_model
from tests.serving import openai_client, running
from tests.test_reasoning import QWEN3_STYLE, R1_STYLE, reference_split
from tests.thinking_model import END_ID, START_ID, make_thinking_model

MESSAGES = [{"role": "user", "content": "Is 7 prime?"}]


def serve(template: str | None = None, **options):
    jinja = {} if template is None else {"jinja": {"chat_template": template, "eos": "<|im_end|>"}}
    return ServedModel(load_model(**jinja), "m", **options)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """name -> an openai client: r1 (the prompt opens the block), qwen3 (the model writes it,
    enable_thinking switches it), raw (r1, not split), added (the markers are one special token
    each), plain (the fixture's own template: no thinking)."""
    from mnngpu import llm

    folder = make_thinking_model(tmp_path_factory.mktemp("thinking") / "model", QWEN3_STYLE)
    added = llm.create(folder / "config.json")
    added.set_config({**ORACLE_CONFIG, "sampler_type": "greedy"})
    added.load()
    models = {"r1": serve(R1_STYLE), "qwen3": serve(QWEN3_STYLE), "raw": serve(R1_STYLE, reasoning_format="none"),
              "added": ServedModel(added, "m"), "plain": serve()}
    with running(create_app(models["r1"])) as r1, running(create_app(models["qwen3"])) as qwen3, \
            running(create_app(models["raw"])) as raw, running(create_app(models["added"])) as added_client, \
            running(create_app(models["plain"])) as plain:
        yield {"r1": openai_client(r1), "qwen3": openai_client(qwen3), "raw": openai_client(raw),
               "added": openai_client(added_client), "plain": openai_client(plain), "models": models}


def token_id(served: ServedModel, text: str) -> int:
    tokenizer = served.llm.tokenizer
    (token,) = tokenizer.encode(text)[len(tokenizer.prefix_ids):]
    return token


def end_ids(served: ServedModel) -> list[int]:
    tokenizer = served.llm.tokenizer
    return tokenizer.encode("</think>")[len(tokenizer.prefix_ids):]


def ask(api, bias: dict[int, float], stream: bool = False, **fields):
    body = {"model": "m", "messages": MESSAGES, "temperature": 0, "logit_bias": {str(k): v for k, v in bias.items()}}
    extra = {name: fields.pop(name) for name in ("chat_template_kwargs", "thinking_budget_tokens") if name in fields}
    if not stream:
        return api.chat.completions.create(**body, **fields, extra_body=extra or None)
    chunks = list(api.chat.completions.create(**body, **fields, extra_body=extra or None, stream=True,
                                              stream_options={"include_usage": True}))
    return chunks


def joined(chunks, name: str) -> str:
    return "".join(getattr(c.choices[0].delta, name, None) or "" for c in chunks if c.choices)


def reasoning_of(message) -> str | None:
    extra = message.model_extra or {}
    assert extra.get("reasoning") == extra.get("reasoning_content")   # vLLM's name, the same text
    return extra.get("reasoning_content")


# ---- the split --------------------------------------------------------------------------------------------


def test_a_reply_cut_off_inside_the_block_keeps_its_text_as_reasoning(servers):
    a = token_id(servers["models"]["r1"], "a")
    raw = ask(servers["raw"], {a: 100}, max_tokens=8)
    reply = ask(servers["r1"], {a: 100}, max_tokens=8)
    assert reference_split(raw.choices[0].message.content, inside=True) == ("a" * 8, None)
    assert (reasoning_of(reply.choices[0].message), reply.choices[0].message.content) == ("a" * 8, None)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens_details.reasoning_tokens == 8
    assert raw.usage.completion_tokens_details.reasoning_tokens == 0   # not split: not counted

    chunks = ask(servers["r1"], {a: 100}, stream=True, max_tokens=8)
    assert joined(chunks, "content") == "" and joined(chunks, "reasoning_content") == "a" * 8
    assert joined(chunks, "reasoning") == "a" * 8
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 8


@pytest.mark.parametrize("budget", [0, 3])
@pytest.mark.parametrize("stream", [False, True])
def test_the_budget_closes_the_block_after_that_many_tokens(servers, budget, stream):
    served = servers["models"]["r1"]
    tokenizer, a, end = served.llm.tokenizer, token_id(served, "a"), end_ids(served)
    count = budget + len(end) + 4
    result = ask(servers["r1"], {a: 100}, stream=stream, max_tokens=count, logprobs=True,
                 thinking_budget_tokens=budget)
    if stream:
        entries = [e for c in result if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        reasoning, content = joined(result, "reasoning_content"), joined(result, "content")
        usage = result[-1].usage
    else:
        entries = result.choices[0].logprobs.content
        reasoning, content = reasoning_of(result.choices[0].message), result.choices[0].message.content
        usage = result.usage
    assert [bytes(e.bytes) for e in entries] == [tokenizer.token_bytes(i) for i in [a] * budget + end + [a] * 4]
    whole = "".join(e.token for e in entries)
    assert reference_split(whole, inside=True) == (reasoning, content) == ("a" * budget, "a" * 4)
    assert usage.completion_tokens_details.reasoning_tokens == budget + len(end)


@pytest.mark.parametrize("stream", [False, True])
def test_a_start_marker_the_model_writes_as_one_special_token(servers, stream):
    """<think> is special, so a reply would hide it: a thinking model's markers are shown and split."""
    result = ask(servers["added"], {START_ID: 100}, stream=stream, max_tokens=8, logprobs=True,
                 thinking_budget_tokens=2)
    if stream:
        entries = [e for c in result if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        reasoning, content = joined(result, "reasoning_content"), joined(result, "content")
        usage = result[-1].usage
    else:
        entries = result.choices[0].logprobs.content
        reasoning, content = reasoning_of(result.choices[0].message), result.choices[0].message.content
        usage = result.usage
    assert "".join(e.token for e in entries) == "<think>" * 3 + "</think>" + "<think>" * 4
    assert reference_split("".join(e.token for e in entries), inside=False) == (reasoning, content)
    assert (reasoning, content) == ("<think>" * 2, "<think>" * 4)
    assert usage.completion_tokens_details.reasoning_tokens == 4   # the opening, 2 thought, the forced end
    assert END_ID in servers["models"]["added"].thinking.special_ids


def test_reasoning_format_none_leaves_the_reply_whole(servers):
    a = token_id(servers["models"]["raw"], "a")
    reply = ask(servers["raw"], {a: 100}, max_tokens=5, thinking_budget_tokens=1)
    assert reply.choices[0].message.content == "a" * 5 and reasoning_of(reply.choices[0].message) is None


# ---- the switches -------------------------------------------------------------------------------------------


def rendered_count(**variables) -> int:
    """The tokens of the qwen3-style prompt for MESSAGES, rendered by transformers."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(MODEL_DIR / "hf" / "tokenizer.json"))
    text = hf.apply_chat_template(MESSAGES, chat_template=QWEN3_STYLE, tokenize=False, add_generation_prompt=True,
                                  **variables)
    assert text.endswith("<think>\n\n</think>\n\n") == (variables.get("enable_thinking") is False)
    return hf_count(text)


@pytest.mark.parametrize("fields, variables", [
    ({"chat_template_kwargs": {"enable_thinking": False}}, {"enable_thinking": False}),
    ({"reasoning_effort": "none"}, {"enable_thinking": False}),
    ({"reasoning_effort": "minimal"}, {"enable_thinking": False}),
    ({"reasoning_effort": "high"}, {"enable_thinking": True}),
    ({"chat_template_kwargs": {"enable_thinking": True, "unread_variable": [1, 2]}}, {"enable_thinking": True}),
    ({}, {}),
])
def test_template_switches_reach_the_template(servers, fields, variables):
    a = token_id(servers["models"]["qwen3"], "a")
    reply = ask(servers["qwen3"], {a: 100}, max_tokens=4, **fields)
    assert reply.usage.prompt_tokens == rendered_count(**variables)
    # the model writes no block of its own here: all answer, nothing counted
    assert reply.choices[0].message.content == "a" * 4 and reasoning_of(reply.choices[0].message) is None
    assert reply.usage.completion_tokens_details.reasoning_tokens == 0


def test_a_grammar_turns_thinking_off(servers):
    pytest.importorskip("llguidance")
    reply = servers["qwen3"].chat.completions.create(model="m", messages=MESSAGES, max_tokens=6, temperature=0,
                                                     response_format={"type": "json_object"})
    assert reply.usage.prompt_tokens == rendered_count(enable_thinking=False)
    assert reasoning_of(reply.choices[0].message) is None


REFUSALS = [
    ("qwen3", {"chat_template_kwargs": "enable_thinking=false"}, "chat_template_kwargs"),
    ("qwen3", {"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
    ("qwen3", {"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs.add_generation_prompt"),
    ("qwen3", {"reasoning_effort": "extreme"}, "reasoning_effort"),
    ("qwen3", {"thinking_budget_tokens": -2}, "thinking_budget_tokens"),
    ("qwen3", {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}, "reasoning_effort"),
    ("qwen3", {"reasoning_effort": "high", "response_format": {"type": "json_object"}}, "reasoning_effort"),
    ("qwen3", {"chat_template_kwargs": {"enable_thinking": True}, "response_format": {"type": "json_object"}},
     "chat_template_kwargs.enable_thinking"),
    ("r1", {"reasoning_effort": "none"}, "reasoning_effort"),
    ("r1", {"response_format": {"type": "json_object"}}, "response_format"),
    ("plain", {"reasoning_effort": "low"}, "reasoning_effort"),
    ("plain", {"thinking_budget_tokens": 5}, "thinking_budget_tokens"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("server, fields, param", REFUSALS)
def test_what_the_model_cannot_do_is_a_400_naming_the_field(servers, server, fields, param, stream):
    if "response_format" in fields:
        pytest.importorskip("llguidance")
    with pytest.raises(openai.BadRequestError) as refused:
        servers[server].chat.completions.create(model="m", messages=MESSAGES, max_tokens=2, stream=stream,
                                                extra_body=fields)
    assert refused.value.status_code == 400 and refused.value.body["param"] == param
    if server != "qwen3" or "response_format" in fields:   # it says what the model can do
        assert re.search(r"does not think|cannot switch|think first|opens a think block", refused.value.message)
