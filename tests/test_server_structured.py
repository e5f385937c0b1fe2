"""Structured output through `mnngpu serve` and the `openai` client: response_format json_object,
json_schema (strict or not), and the grammar and regex extensions, streamed and not.

Truths: `jsonschema` validates each reply against the schema the request sent, Python's `re`
matches the regex replies, and a Lark grammar's language is written out here by hand. The same
requests without a response_format give replies that do not parse, so an ignored field fails.
"""

from __future__ import annotations

import json
import re

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

from tests.serving import ServeProcess

MESSAGES = [{"role": "user", "content": "What colour is a crow?"}]
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "pet": {"enum": ["cat", "dog", "none"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2},
}, "required": ["name", "age", "pet", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server():
    process = ServeProcess("--quiet")
    yield process
    process.kill()


def reply(server, stream: bool, **fields) -> tuple[str, str]:
    """(text, finish_reason) of one chat reply, read whole or from its stream."""
    request = {"model": "any", "messages": MESSAGES, "max_tokens": 160, "temperature": 0, **fields}
    if not stream:
        choice = server.api.chat.completions.create(**request).choices[0]
        return choice.message.content, choice.finish_reason
    text, finish = "", None
    for chunk in server.api.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


def does_not_parse(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return True
    return False


def test_without_a_response_format_the_reply_is_not_json(server):
    assert does_not_parse(reply(server, False)[0])


@pytest.mark.parametrize("stream", [False, True])
def test_json_object_replies_are_a_json_object(server, stream):
    text, finish = reply(server, stream, response_format={"type": "json_object"})
    assert finish == "stop" and isinstance(json.loads(text), dict), text


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("temperature", [0, 1.0])
def test_json_schema_replies_validate_against_the_schema(server, stream, strict, temperature):
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": strict}}
    for seed in range(3 if temperature else 1):
        text, finish = reply(server, stream, response_format=response_format, temperature=temperature, seed=seed)
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), PERSON)


def test_a_whole_and_a_streamed_reply_are_the_same(server):
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    assert reply(server, False, response_format=response_format) == reply(server, True, response_format=response_format)


@pytest.mark.parametrize("stream", [False, True])
def test_regex_replies_match_the_regex(server, stream):
    pattern = r"[0-9]{3}-[a-z]{2,4}( [A-Z][a-z]+)?"
    for seed in range(3):
        text, finish = reply(server, stream, response_format={"type": "regex", "regex": pattern}, temperature=1.0,
                             seed=seed)
        assert finish == "stop" and re.fullmatch(pattern, text), text


LARK = """
start: answer " because " reason
answer: "yes" | "no" | "maybe"
reason: WORD (" " WORD){0,2}
WORD: /[a-z]{1,6}/
"""


@pytest.mark.parametrize("stream", [False, True])
def test_lark_grammar_replies_are_in_the_grammars_language(server, stream):
    language = re.compile(r"(yes|no|maybe) because [a-z]{1,6}( [a-z]{1,6}){0,2}")
    for seed in range(3):
        text, finish = reply(server, stream, response_format={"type": "grammar", "grammar": LARK}, temperature=1.0,
                             seed=seed)
        assert finish == "stop" and language.fullmatch(text), text


def test_the_grammar_ends_the_reply_when_nothing_more_can_follow(server):
    text, finish = reply(server, False, response_format={"type": "regex", "regex": "abc"}, max_tokens=50)
    assert (text, finish) == ("abc", "stop")


@pytest.mark.parametrize(("response_format", "param"), [
    ({"type": "regex", "regex": "(("}, "response_format.regex"),
    ({"type": "grammar", "grammar": "start: undefined_rule"}, "response_format.grammar"),
    ({"type": "grammar", "grammar": "start: start"}, "response_format.grammar"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "no-such"}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}},
     "response_format.json_schema.extra"),
    ({"type": "xml"}, "response_format"),
    ({"type": "json_object", "schema": {}}, "response_format.schema"),
])
def test_a_bad_response_format_gets_a_400_naming_the_field(server, response_format, param):
    with pytest.raises(openai.BadRequestError) as refused:
        server.api.chat.completions.create(model="any", messages=MESSAGES, response_format=response_format)
    assert refused.value.body["param"] == param, refused.value.body


def test_each_of_n_choices_follows_the_grammar_on_its_own(server):
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    replies = server.api.chat.completions.create(model="any", messages=MESSAGES, max_tokens=160, temperature=1.0,
                                                 seed=7, n=3, response_format=response_format).choices
    assert len({choice.message.content for choice in replies}) > 1
    for choice in replies:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)
