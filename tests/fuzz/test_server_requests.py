"""Property-based fuzz of the server's request bodies: over 5,000 requests to the app, in process,
on the demo model (about 70 s of CPU time).

Each case is a body the test builds knowing what it should get:

    valid   a body every rule of OpenAI's API (and docs/server.md's limits) accepts: 200
    bad     a valid body with one field broken (wrong type, out of range, unknown name, a bad message,
            a bad token id ...): 400 or 422, with an error whose `param` names that field
    either  a body whose fate depends on a library's reading (a regex, a JSON schema, tools for a
            template that may not render them): 200, or a 4xx naming the field
    not JSON an object-less body (bytes, cut JSON, a JSON array ...): 400
    too deep a body with one field nested deeper than docs/server.md's limit (up to 3,000 levels,
            past Python's recursion limit): 400 `nested_too_deep`; within the limit, a body nested
            as deep gets 200 or an error naming the field, never the depth error

and no request ever gets a 500. The rules here are written from OpenAI's API reference and the
limits docs/server.md states; only which fields are refused is read from the server's table of
fields (fields.py, the table docs/server.md shows). The runs are derandomized, so CI sees the same
cases every time.
"""

from __future__ import annotations

import json
import math
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient

from mnngpu import llm
from mnngpu.apps.server.app import create_app
from mnngpu.apps.server.engine import ServedModel
from mnngpu.apps.server.fields import CHAT, COMPLETIONS, FIELDS, REFUSED, field_names
from mnngpu.apps.server.fields import MESSAGES as MESSAGES_API
from mnngpu.apps.server.fields import RESPONSES as RESPONSES_API
from mnngpu.demo import demo_model_dir

# Requests per test; together at least 5,000.
EXAMPLES = {"chat": 1700, "completions": 1700, "tokenize": 700, "detokenize": 500, "messages": 700, "responses": 700,
            "not_json": 500, "nested": 400}
NEW_TOKENS = st.integers(1, 2)   # what valid requests generate at most, so the run stays short
MAX_STOP, MAX_TOP_LOGPROBS, MAX_CHOICES = 4, 20, 128
MAX_DEPTH = 100   # the deepest a body may nest arrays and objects, the body itself being level 1
ROLES = ("system", "developer", "user", "assistant")
TOKENIZE_FIELDS = ("model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "return_token_strs")
FUZZ_SETTINGS = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                HealthCheck.filter_too_much])


@dataclass(frozen=True)
class Case:
    body: Any                   # what is sent as JSON; bytes are sent as they are
    expect: str                 # "valid", "bad", "either", "not_json" or "too_deep"
    param: str | None = None    # bad and either: the field the error must name (or a part of it)

    def raw(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


# ---- values ----------------------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8"), max_size=16)   # no lone surrogates: JSON text a client means
WORDS = st.text(st.characters(codec="utf-8"), min_size=1, max_size=16)
NAMES = st.text(string.ascii_letters + "_", min_size=1, max_size=12)
BIG_INTS = st.integers(min_value=-(2**70), max_value=2**70)
LONE_SURROGATE_TEXT = st.builds(lambda a, s, b: a + s + b, TEXT, st.characters(categories=["Cs"]), TEXT)
# values that code reading a field with `or`, truthiness or int() gets wrong
EDGES = st.sampled_from([0, 0.0, -0.0, False, True, "", [], {}, "0", "1", "-1", 1e308, -1, 2**63, 2**64])
JUNK = EDGES | st.recursive(
    st.none() | st.booleans() | BIG_INTS | st.floats(allow_nan=True, allow_infinity=True) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6)
# strings that str.isdigit() or int() accept but are no plain token id
NOT_IDS = st.sampled_from(["²", "٣", "１", " 1", "1 ", "+1", "-1", "1.0", "0x1", "1e3", "1_0", ""])
SOME_JUNK = JUNK.filter(lambda v: v is not None)   # a null field counts as absent, as in OpenAI's API


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return is_int(value) or isinstance(value, float) and math.isfinite(value)


def in_range(low: float, high: float, low_open: bool = False):
    return lambda v: is_number(v) and (low < v if low_open else low <= v) and v <= high


def ints_from(low: int, high: int | None = None):
    return lambda v: is_int(v) and low <= v and (high is None or v <= high)


def is_prompt(value: Any) -> bool:
    """One prompt: a non-empty string or a non-empty list of token ids (their range is checked apart)."""
    return isinstance(value, str) and value != "" or isinstance(value, list) and bool(value) and all(
        is_int(i) for i in value)


def is_stop(value: Any) -> bool:
    values = [value] if isinstance(value, str) else value
    return isinstance(values, list) and len(values) <= MAX_STOP and all(isinstance(s, str) and s for s in values)


def breaking(valid) -> st.SearchStrategy:
    """Non-null values that `valid` refuses: junk, and numbers near and far from the edges."""
    numbers = st.floats(allow_nan=True, allow_infinity=True) | BIG_INTS | st.integers(-3, 3) | st.sampled_from(
        [-0.5, 1.5, 2.0001, 20.5, 21, 129, -1, 0])
    return st.one_of(JUNK, numbers, st.booleans()).filter(lambda v: v is not None and not valid(v))


# the rules of the sampling and shape fields both generating endpoints share
COMMON_RULES = {
    "temperature": in_range(0, 2),
    "top_p": in_range(0, 1, low_open=True),
    "seed": ints_from(0),
    "presence_penalty": in_range(-2, 2),
    "frequency_penalty": in_range(-2, 2),
    "stop": is_stop,
    "stream": lambda v: isinstance(v, bool),
}
CHAT_RULES = {**COMMON_RULES, "max_tokens": ints_from(1), "max_completion_tokens": ints_from(1),
              "n": ints_from(1, MAX_CHOICES), "logprobs": lambda v: isinstance(v, bool)}
COMPLETION_RULES = {**COMMON_RULES, "max_tokens": ints_from(0), "n": ints_from(1, MAX_CHOICES),
                    "logprobs": ints_from(0, MAX_TOP_LOGPROBS), "echo": lambda v: isinstance(v, bool)}


def common_fields(vocab: int) -> dict[str, st.SearchStrategy]:
    """Valid values of the optional fields, small enough that a valid request stays quick."""
    return {
        "temperature": st.sampled_from([0, 0.0, 0.5, 1, 2.0]) | st.floats(0, 2),
        "top_p": st.floats(0, 1, exclude_min=True),
        "seed": st.integers(0, 2**70),
        "presence_penalty": st.floats(-2, 2),
        "frequency_penalty": st.floats(-2, 2),
        "stop": WORDS | st.lists(WORDS, max_size=MAX_STOP),
        "n": st.integers(1, 2),
        "logit_bias": st.dictionaries(st.integers(0, vocab - 1).map(str), st.floats(-100, 100), max_size=3),
        "user": TEXT,
        "model": TEXT,
    }


def stream_fields() -> st.SearchStrategy:
    return st.one_of(st.just({}), st.just({"stream": False}),
                     st.fixed_dictionaries({"stream": st.just(True)},
                                           optional={"stream_options": st.fixed_dictionaries(
                                               {}, optional={"include_usage": st.booleans(),
                                                             "include_obfuscation": st.booleans()})}))


# ---- messages --------------------------------------------------------------------------------------

def content() -> st.SearchStrategy:
    return TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2)


def tool_calls() -> st.SearchStrategy:
    arguments = st.dictionaries(NAMES, st.integers() | TEXT, max_size=2).map(json.dumps)
    call = st.fixed_dictionaries({"id": NAMES, "type": st.just("function"),
                                  "function": st.fixed_dictionaries({"name": NAMES, "arguments": arguments})})
    return st.lists(call, min_size=1, max_size=2)


def message() -> st.SearchStrategy:
    plain = st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": content()})
    caller = st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none() | TEXT,
                                    "tool_calls": tool_calls()})
    tool = st.fixed_dictionaries({"role": st.just("tool"), "content": TEXT, "tool_call_id": NAMES})
    return st.one_of(plain, plain, caller, tool)


def messages() -> st.SearchStrategy:
    return st.lists(message(), min_size=1, max_size=3)


@st.composite
def broken_message(draw, index: int) -> tuple[Any, str]:
    """A message with one thing wrong, and the param its error must name."""
    where = f"messages[{index}]"
    good = draw(message())
    kind = draw(st.sampled_from(["junk", "role", "role_type", "extra", "content", "part", "surrogate",
                                 "tool_call_id", "tool_calls", "arguments"]))
    if kind == "junk":
        return draw(JUNK.filter(lambda v: not isinstance(v, dict))), where
    if kind == "role":
        return {**good, "role": draw(WORDS.filter(lambda r: r not in (*ROLES, "tool")))}, f"{where}.role"
    if kind == "role_type":
        return {**good, "role": draw(JUNK.filter(lambda v: not isinstance(v, str)))}, where
    if kind == "extra":
        name = draw(NAMES.filter(lambda n: n not in ("role", "content", "tool_calls", "tool_call_id")))
        return {**good, name: draw(JUNK.filter(lambda v: v is not None))}, f"{where}.{name}"
    if kind == "content":
        bad = JUNK.filter(lambda v: v is not None and not isinstance(v, str | list))
        return {**good, "content": draw(bad)}, f"{where}.content"
    if kind == "part":
        part = draw(JUNK.filter(lambda v: not (isinstance(v, dict) and v.get("type") in
                                               ("text", "image_url", "input_audio"))))
        return {**good, "content": [{"type": "text", "text": "a"}, part]}, f"{where}.content"
    if kind == "surrogate":
        return {**good, "content": draw(LONE_SURROGATE_TEXT)}, where
    if kind == "tool_call_id":
        return {"role": "tool", "content": draw(TEXT), "tool_call_id": draw(JUNK.filter(
            lambda v: not isinstance(v, str)))}, f"{where}.tool_call_id"
    if kind == "tool_calls":
        return {"role": "assistant", "tool_calls": draw(JUNK.filter(lambda v: v is not None and (
            not isinstance(v, list) or any(not isinstance(call, dict) for call in v))))}, f"{where}.tool_calls"
    not_an_object = TEXT.filter(lambda t: not _is_json_object(t))
    calls = draw(tool_calls())
    calls[0] = {**calls[0], "function": {**calls[0]["function"], "arguments": draw(not_an_object)}}
    return {"role": "assistant", "tool_calls": calls}, f"{where}.tool_calls"


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


# ---- bodies ----------------------------------------------------------------------------------------

@st.composite
def valid_chat(draw, vocab: int) -> dict:
    optional = {**common_fields(vocab), "response_format": st.just({"type": "text"}),
                "top_logprobs": st.integers(0, MAX_TOP_LOGPROBS), "metadata": JUNK, "store": JUNK}
    body = draw(st.fixed_dictionaries({"messages": messages(), "max_tokens": NEW_TOKENS}, optional=optional))
    if "top_logprobs" in body or draw(st.booleans()):
        body["logprobs"] = True
    if draw(st.booleans()):
        body["max_completion_tokens"] = body.pop("max_tokens")
    return {**body, **draw(stream_fields())}


@st.composite
def valid_completion(draw, vocab: int) -> dict:
    ids = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=6)
    prompt = WORDS | st.lists(WORDS, min_size=1, max_size=2) | ids | st.lists(ids, min_size=1, max_size=2)
    optional = {**common_fields(vocab), "echo": st.booleans(), "logprobs": st.integers(0, MAX_TOP_LOGPROBS),
                "best_of": st.just(1), "suffix": st.just("")}
    body = draw(st.fixed_dictionaries({"prompt": prompt, "max_tokens": NEW_TOKENS}, optional=optional))
    if body.get("echo") and draw(st.booleans()):
        body["max_tokens"] = 0
    return {**body, **draw(stream_fields())}


def fields_of(endpoint: str, status: str) -> list[str]:
    return [name for name, known in FIELDS.items() if endpoint in known.endpoints and known.status == status]


def asking(name: str) -> st.SearchStrategy:
    """Values of a refused field that ask for something (not null, nor the one value that asks nothing)."""
    accepted = {"best_of": [1], "suffix": [""], "modalities": [["text"]], "functions": [[]],
                "function_call": ["none"]}.get(name, [])
    return JUNK.filter(lambda v: v is not None and not isinstance(v, bool) and v not in accepted)


@st.composite
def broken_common(draw, body: dict, endpoint: str, rules: dict, vocab: int) -> Case:
    """`body` with one of the fields both endpoints share broken."""
    kind = draw(st.sampled_from(["rule", "logit_bias", "unknown", "rule", "refused", "stream_options", "rule",
                                 "logit_bias"]))
    if kind == "rule":
        name = draw(st.sampled_from(sorted(rules)))
        body = {key: value for key, value in body.items() if key not in ("max_tokens", "max_completion_tokens")
                or name not in ("max_tokens", "max_completion_tokens")}
        return Case({**body, name: draw(breaking(rules[name]))}, "bad", name)
    if kind == "unknown":
        name = draw(NAMES.filter(lambda n: n not in FIELDS or endpoint not in FIELDS[n].endpoints))
        return Case({**body, name: draw(SOME_JUNK)}, "bad", name)
    if kind == "refused":
        name = draw(st.sampled_from(fields_of(endpoint, REFUSED)))
        return Case({**body, name: draw(asking(name))}, "bad", name)
    if kind == "logit_bias":
        bad_key = st.one_of(NOT_IDS, NOT_IDS, st.integers(vocab, 2**70).map(str),
                            TEXT.filter(lambda k: not (k.isascii() and k.isdigit())))
        bias = draw(st.one_of(
            st.dictionaries(bad_key, st.floats(-100, 100), min_size=1, max_size=2),
            JUNK.filter(lambda v: v is not None and not isinstance(v, dict)),
            st.dictionaries(st.integers(0, vocab - 1).map(str), breaking(in_range(-100, 100)), min_size=1,
                            max_size=2)))
        return Case({**body, "logit_bias": bias}, "bad", "logit_bias")
    options = st.one_of(JUNK.filter(lambda v: v is not None and v != {} and not isinstance(v, dict)),
                        st.fixed_dictionaries({"include_usage": breaking(lambda v: isinstance(v, bool))}),
                        st.dictionaries(NAMES.filter(lambda n: n not in ("include_usage", "include_obfuscation")),
                                        JUNK, min_size=1, max_size=1))
    return Case({**body, "stream": True, "stream_options": draw(options)}, "bad", "stream_options")


@st.composite
def chat_cases(draw, vocab: int) -> Case:
    body = draw(valid_chat(vocab))
    # hypothesis draws the first choice most: the cheap bad bodies, before the valid ones that generate
    kind = draw(st.sampled_from(["common", "message", "valid", "messages", "common", "logprobs", "output_shape",
                                 "message", "valid"]))
    if kind == "valid":
        return Case(body, "valid")
    if kind == "common":
        return draw(broken_common(body, CHAT, CHAT_RULES, vocab))
    if kind == "messages":
        bad = JUNK.filter(lambda v: v is not None and not (isinstance(v, list) and v)) | st.just([])
        return Case({**body, "messages": draw(bad)}, "bad", "messages")
    if kind == "message":
        index = draw(st.integers(0, len(body["messages"])))
        wrong, param = draw(broken_message(index))
        return Case({**body, "messages": [*body["messages"][:index], wrong, *body["messages"][index:]]}, "bad",
                    param)
    if kind == "logprobs":
        body.pop("logprobs", None)
        wrong = draw(st.one_of(
            st.fixed_dictionaries({"logprobs": st.just(True), "top_logprobs": breaking(ints_from(0, 20))}),
            st.fixed_dictionaries({"top_logprobs": st.integers(0, 20)},
                                  optional={"logprobs": st.just(False)})))
        return Case({**body, **wrong}, "bad", "top_logprobs")
    return draw(output_shape_case(body))


@st.composite
def output_shape_case(draw, body: dict) -> Case:
    """response_format and tools: junk is refused by name; a regex, schema or tool list may be read or not."""
    body = {key: value for key, value in body.items() if key != "response_format"}
    name = draw(st.sampled_from(["response_format", "tools", "tool_choice", "parallel_tool_calls"]))
    if name == "parallel_tool_calls":
        return Case({**body, name: draw(breaking(lambda v: isinstance(v, bool)))}, "bad", name)
    if draw(st.booleans()):
        junk = JUNK.filter(lambda v: v is not None and not isinstance(v, dict | list | str))
        return Case({**body, name: draw(junk)}, "bad", name)
    if name == "response_format":
        kind = draw(st.sampled_from(["regex", "grammar", "json_schema", "json_object", "unknown"]))
        value = {"type": kind}
        if kind in ("regex", "grammar"):
            value[kind] = draw(TEXT)
        elif kind == "json_schema":
            value[kind] = draw(st.fixed_dictionaries({"name": NAMES}, optional={"schema": JUNK, "strict": JUNK}))
        return Case({**body, name: value}, "either", name)
    tools = st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": NAMES}, optional={"parameters": JUNK, "description": JUNK})}), max_size=2)
    choice = st.sampled_from(["none", "auto", "required"]) | JUNK
    return Case({**body, "tools": draw(tools), "tool_choice": draw(choice)}, "either", "tool")


@st.composite
def completion_cases(draw, vocab: int) -> Case:
    body = draw(valid_completion(vocab))
    kind = draw(st.sampled_from(["common", "prompt", "valid", "token_ids", "common", "zero_tokens",
                                 "too_many_choices", "valid"]))
    if kind == "valid":
        return Case(body, "valid")
    if kind == "common":
        return draw(broken_common(body, COMPLETIONS, COMPLETION_RULES, vocab))
    if kind == "prompt":
        empty = st.sampled_from(["", [], [""], [[]], ["a", ""], [[1], []]])
        wrong = JUNK.filter(lambda v: v is not None and not isinstance(v, str | list))
        mixed = st.lists(JUNK, min_size=1, max_size=3).filter(lambda v: not all(is_prompt(p) for p in v)
                                                              and not all(is_int(p) for p in v))
        return Case({**body, "prompt": draw(empty | wrong | mixed | LONE_SURROGATE_TEXT)}, "bad", "prompt")
    if kind == "token_ids":
        outside = st.integers(vocab, 2**70) | st.integers(-(2**70), -1)
        ids = draw(st.lists(st.integers(0, vocab - 1), max_size=3))
        ids.insert(draw(st.integers(0, len(ids))), draw(outside))
        return Case({**body, "prompt": draw(st.sampled_from([ids, [ids], [[1], ids]]))}, "bad", "prompt")
    if kind == "zero_tokens":
        return Case({**body, "echo": False, "max_tokens": 0}, "bad", "max_tokens")
    prompts = draw(st.lists(WORDS, min_size=2, max_size=4))
    n = draw(st.integers(MAX_CHOICES // len(prompts) + 1, MAX_CHOICES))
    return Case({**body, "prompt": prompts, "n": n}, "bad", "n")


@st.composite
def tokenize_cases(draw, vocab: int) -> Case:
    flags = {"add_special_tokens": st.booleans(), "return_token_strs": st.booleans(), "model": TEXT}
    by_prompt = st.fixed_dictionaries({"prompt": TEXT}, optional=flags)
    by_messages = st.fixed_dictionaries({"messages": messages()},
                                        optional={**flags, "add_generation_prompt": st.booleans()})
    body = draw(by_prompt | by_messages)
    kind = draw(st.sampled_from(["message", "flag", "valid", "unknown", "prompt", "surrogate", "valid"]))
    if kind == "valid":
        return Case(body, "valid")
    if kind == "unknown":
        name = draw(NAMES.filter(lambda n: n not in TOKENIZE_FIELDS))
        return Case({**body, name: draw(SOME_JUNK)}, "bad", name)
    if kind == "flag":
        name = draw(st.sampled_from(["add_special_tokens", "return_token_strs"]))
        return Case({**body, name: draw(breaking(lambda v: isinstance(v, bool)))}, "bad", name)
    if kind == "prompt":
        return Case({"prompt": draw(JUNK.filter(lambda v: not isinstance(v, str)))}, "bad", "prompt")
    if kind == "surrogate":
        return Case({"prompt": draw(LONE_SURROGATE_TEXT)}, "bad", "prompt")
    wrong, param = draw(broken_message(0))
    return Case({"messages": [wrong]}, "bad", param)


@st.composite
def detokenize_cases(draw, vocab: int) -> Case:
    ids = st.lists(st.integers(0, vocab - 1), max_size=8)
    body = draw(st.fixed_dictionaries({"tokens": ids}, optional={"model": TEXT}))
    kind = draw(st.sampled_from(["junk", "outside", "valid", "unknown", "valid"]))
    if kind == "valid":
        return Case(body, "valid")
    if kind == "unknown":
        name = draw(NAMES.filter(lambda n: n not in ("model", "tokens")))
        return Case({**body, name: draw(SOME_JUNK)}, "bad", name)
    if kind == "outside":
        tokens = [*body["tokens"], draw(st.integers(vocab, 2**70) | st.integers(-(2**70), -1))]
        return Case({"tokens": draw(st.permutations(tokens))}, "bad", "tokens")
    wrong = JUNK.filter(lambda v: not (isinstance(v, list) and all(is_int(i) and 0 <= i < vocab for i in v)))
    return Case({"tokens": draw(wrong)}, "bad", "tokens")


def not_json_bodies() -> st.SearchStrategy:
    cut = st.builds(lambda text, at: text[:at], st.just(json.dumps({"prompt": "hello", "max_tokens": 1})),
                    st.integers(0, 30))
    not_objects = JUNK.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v))
    raw = st.binary(max_size=40).filter(lambda b: not _decodes_to_object(b))
    return st.one_of(cut.map(str.encode), not_objects.map(str.encode), raw)


def _decodes_to_object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except ValueError:
        return False


# a valid body of each endpoint, for a nested field to join, and the fields worth nesting in it
VALID = {"chat": valid_chat, "completions": valid_completion,
         "tokenize": lambda vocab: st.fixed_dictionaries({"prompt": WORDS}),
         "detokenize": lambda vocab: st.fixed_dictionaries({"tokens": st.lists(st.integers(0, vocab - 1),
                                                                               max_size=8)}),
         "messages": lambda vocab: st.fixed_dictionaries({"messages": st.just([{"role": "user", "content": "hi"}]),
                                                          "max_tokens": NEW_TOKENS}),
         "responses": lambda vocab: st.fixed_dictionaries({"input": WORDS, "max_output_tokens": NEW_TOKENS})}
NESTED_FIELDS = {"chat": ["messages", "metadata", "tools", "response_format", "logit_bias", "stop"],
                 "completions": ["prompt", "logit_bias", "stop", "user"], "tokenize": ["prompt"],
                 "detokenize": ["tokens"], "messages": ["messages", "system", "metadata", "tools"],
                 "responses": ["input", "metadata", "text", "tools"]}
OPENERS = {"[": "]", '{"k": ': "}", '{"type": "object", "properties": ': "}", "[1, ": "]"}


@st.composite
def nested_cases(draw, vocab: int) -> tuple[str, Case]:
    """An endpoint, and a valid body of it with one field nested `depth` levels deep (the body is level
    1). The body is sent as text, built a level pattern at a time, so that no depth is too deep for
    the test's own json.dumps."""
    endpoint = draw(st.sampled_from(sorted(NESTED_FIELDS)))
    depth = draw(st.integers(MAX_DEPTH - 3, MAX_DEPTH + 3) | st.integers(2, MAX_DEPTH)
                 | st.integers(MAX_DEPTH + 1, 3000))
    unknown = NAMES.filter(lambda n: n not in FIELDS and n not in TOKENIZE_FIELDS and n != "tokens"
                           and n not in field_names(MESSAGES_API) | field_names(RESPONSES_API))
    name = draw(st.sampled_from(NESTED_FIELDS[endpoint]) | unknown)
    pattern = draw(st.lists(st.sampled_from(sorted(OPENERS)), min_size=1, max_size=4))
    opens = (pattern * depth)[:depth - 1]
    inner = json.dumps(draw(st.none() | st.booleans() | st.integers() | TEXT))
    nested = "".join(opens) + inner + "".join(OPENERS[o] for o in reversed(opens))
    body = {key: value for key, value in draw(VALID[endpoint](vocab)).items() if key != name}
    raw = json.dumps(body)[:-1] + (", " if body else "") + f"{json.dumps(name)}: {nested}}}"
    return endpoint, Case(raw.encode(), "too_deep" if depth > MAX_DEPTH else "either", name)


def at_the_limit(endpoint: str, body: dict, name: str, depth: int) -> tuple[str, Case]:
    """`body` with `name` nested in arrays to `depth` levels: the cases either side of the limit, sent
    whatever the draws are (which cases hypothesis draws shifts with the modules loaded beside this one)."""
    nested = "[" * (depth - 1) + "1" + "]" * (depth - 1)
    raw = json.dumps(body)[:-1] + f', "{name}": {nested}}}'
    return endpoint, Case(raw.encode(), "too_deep" if depth > MAX_DEPTH else "either", name)


LIMIT_CASES = [at_the_limit(endpoint, body, name, depth) for depth in (MAX_DEPTH, MAX_DEPTH + 1)
               for endpoint, body, name in [
                   ("chat", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, "metadata"),
                   ("completions", {"prompt": "hi", "max_tokens": 1}, "user"),
                   ("tokenize", {"add_special_tokens": True}, "prompt"),
                   ("detokenize", {"model": "demo"}, "tokens"),
                   ("messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, "metadata"),
                   ("responses", {"input": "hi", "max_output_tokens": 1}, "metadata")]]


# ---- Anthropic's messages ----------------------------------------------------------------------------

ANTHROPIC_ROLES = ("user", "assistant")
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def is_stop_list(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= MAX_STOP and all(isinstance(s, str) and s for s in value)


# the rules of the sampling fields: Anthropic's (temperature 0 to 1, top_k at least 1)
MESSAGES_RULES = {
    "max_tokens": ints_from(1),
    "temperature": in_range(0, 1),
    "top_p": in_range(0, 1, low_open=True),
    "top_k": ints_from(1),
    "stop_sequences": is_stop_list,
    "stream": lambda v: isinstance(v, bool),
}


def text_blocks() -> st.SearchStrategy:
    return st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2)


def anthropic_turn() -> st.SearchStrategy:
    plain = st.fixed_dictionaries({"role": st.sampled_from(ANTHROPIC_ROLES), "content": TEXT | text_blocks()})
    use = st.fixed_dictionaries({"type": st.just("tool_use"), "id": NAMES, "name": NAMES,
                                 "input": st.dictionaries(NAMES, st.integers() | TEXT, max_size=2)})
    caller = st.fixed_dictionaries({"role": st.just("assistant"), "content": st.lists(use, min_size=1, max_size=2)})
    result = st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": NAMES},
                                   optional={"content": TEXT | text_blocks(), "is_error": st.booleans()})
    answer = st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(result, min_size=1, max_size=2)})
    return st.one_of(plain, plain, caller, answer)


@st.composite
def valid_messages(draw, vocab: int) -> dict:
    optional = {"system": TEXT | text_blocks(), "temperature": st.floats(0, 1),
                "top_p": st.floats(0, 1, exclude_min=True), "top_k": st.integers(1, 50),
                "stop_sequences": st.lists(WORDS, max_size=MAX_STOP), "model": TEXT,
                "stream": st.booleans(), "metadata": JUNK, "thinking": st.just({"type": "disabled"}),
                "service_tier": JUNK, "cache_control": JUNK}
    last = st.fixed_dictionaries({"role": st.just("user"), "content": TEXT | text_blocks()})
    turns = st.tuples(st.lists(anthropic_turn(), max_size=2), last).map(lambda pair: [*pair[0], pair[1]])
    return draw(st.fixed_dictionaries({"messages": turns, "max_tokens": NEW_TOKENS}, optional=optional))


@st.composite
def broken_block(draw, where: str, role: str) -> tuple[Any, str]:
    """A content block with one thing wrong, and the param its error must name."""
    kind = draw(st.sampled_from(["junk", "type", "text", "extra", "image", "media_type", "tool_use", "input"]))
    if kind == "junk":
        return draw(JUNK.filter(lambda v: not isinstance(v, dict))), where
    if kind == "type":
        return {"type": draw(WORDS.filter(lambda t: t not in ("text", "image", "tool_use", "tool_result", "thinking",
                                                              "redacted_thinking")))}, f"{where}.type"
    if kind == "text":
        return {"type": "text", "text": draw(SOME_JUNK.filter(lambda v: not isinstance(v, str)))}, f"{where}.text"
    if kind == "extra":
        name = draw(NAMES.filter(lambda n: n not in ("type", "text", "cache_control", "citations")))
        return {"type": "text", "text": "a", name: draw(SOME_JUNK)}, f"{where}.{name}"
    if kind == "image":
        url = draw(TEXT.filter(lambda u: not u.startswith("data:")))
        return {"type": "image", "source": {"type": "url", "url": url}}, f"{where}.source.url"
    if kind == "media_type":
        bad = draw(SOME_JUNK.filter(lambda v: not isinstance(v, str)) | TEXT.filter(lambda t: "/" not in t))
        return {"type": "image", "source": {"type": "base64", "media_type": bad, "data": "AA=="}}, f"{where}.source"
    if kind == "tool_use" and role == "user":
        return {"type": "tool_use", "id": "a", "name": "f", "input": {}}, f"{where}.type"
    bad_input = SOME_JUNK.filter(lambda v: not isinstance(v, dict))
    return {"type": "tool_use", "id": "a", "name": "f", "input": draw(bad_input)}, f"{where}"


@st.composite
def broken_turn(draw, index: int) -> tuple[Any, str]:
    where = f"messages[{index}]"
    kind = draw(st.sampled_from(["junk", "role", "extra", "content", "block", "surrogate"]))
    if kind == "junk":
        return draw(JUNK.filter(lambda v: not isinstance(v, dict))), where
    if kind == "role":
        return {"role": draw(WORDS.filter(lambda r: r not in (*ANTHROPIC_ROLES, "system"))), "content": "a"}, \
            f"{where}.role"
    if kind == "extra":
        name = draw(NAMES.filter(lambda n: n not in ("role", "content")))
        return {"role": "user", "content": "a", name: draw(SOME_JUNK)}, f"{where}.{name}"
    if kind == "content":
        bad = SOME_JUNK.filter(lambda v: not isinstance(v, str | list))
        return {"role": draw(st.sampled_from(ANTHROPIC_ROLES)), "content": draw(bad)}, f"{where}.content"
    if kind == "surrogate":
        return {"role": "user", "content": [{"type": "text", "text": draw(LONE_SURROGATE_TEXT)}]}, where
    role = draw(st.sampled_from(ANTHROPIC_ROLES))
    block, param = draw(broken_block(f"{where}.content[1]", role))
    return {"role": role, "content": [{"type": "text", "text": "a"}, block]}, param


def refused_row(endpoint: str):
    """(name, values that ask for something) of each refused field of `endpoint`'s own rows."""
    rows = [(key.rpartition(":")[2], row) for key, row in FIELDS.items()
            if endpoint in row.endpoints and row.status == REFUSED]
    return st.sampled_from(rows).flatmap(lambda pair: st.tuples(st.just(pair[0]), JUNK.filter(
        lambda v, row=pair[1]: v is not None and not row.asks_nothing(v))))


@st.composite
def messages_cases(draw, vocab: int) -> Case:
    body = draw(valid_messages(vocab))
    kind = draw(st.sampled_from(["rule", "turn", "valid", "unknown", "refused", "messages", "system", "valid",
                                 "tools", "tool_choice", "prefill"]))
    if kind == "valid":
        return Case(body, "valid")
    if kind == "rule":
        name = draw(st.sampled_from(sorted(MESSAGES_RULES)))
        return Case({**body, name: draw(breaking(MESSAGES_RULES[name]))}, "bad", name)
    if kind == "unknown":
        name = draw(NAMES.filter(lambda n: n not in field_names(MESSAGES_API)))
        return Case({**body, name: draw(SOME_JUNK)}, "bad", name)
    if kind == "refused":
        name, value = draw(refused_row(MESSAGES_API))
        return Case({**body, name: value}, "bad", name)
    if kind == "messages":
        bad = SOME_JUNK.filter(lambda v: not (isinstance(v, list) and v)) | st.just([])
        return Case({**body, "messages": draw(bad)}, "bad", "messages")
    if kind == "system":
        return Case({**body, "system": draw(SOME_JUNK.filter(lambda v: not isinstance(v, str | list)))}, "bad",
                    "system")
    if kind == "prefill":
        ending = draw(st.fixed_dictionaries({"role": st.just("assistant"), "content": TEXT | text_blocks()}))
        return Case({**body, "messages": [*body["messages"], ending]}, "bad", f"messages[{len(body['messages'])}]")
    if kind == "turn":
        index = draw(st.integers(0, len(body["messages"])))
        wrong, param = draw(broken_turn(index))
        return Case({**body, "messages": [*body["messages"][:index], wrong, *body["messages"][index:]]}, "bad", param)
    if kind == "tool_choice":
        junk = SOME_JUNK.filter(lambda v: not (isinstance(v, dict) and v.get("type") in ("auto", "any", "none")))
        return Case({**body, "tool_choice": draw(junk)}, "bad", "tool_choice")
    tools = st.lists(st.fixed_dictionaries({"name": NAMES}, optional={"input_schema": JUNK, "description": JUNK}),
                     max_size=2)
    choice = st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"}]) | JUNK
    return Case({**body, "tools": draw(tools), "tool_choice": draw(choice)}, "either", "tool")


# ---- OpenAI's responses ---------------------------------------------------------------------------------

RESPONSES_RULES = {
    "max_output_tokens": ints_from(1),
    "temperature": in_range(0, 2),
    "top_p": in_range(0, 1, low_open=True),
    "stream": lambda v: isinstance(v, bool),
    "store": lambda v: isinstance(v, bool),
    "parallel_tool_calls": lambda v: isinstance(v, bool),
}


def response_items() -> st.SearchStrategy:
    part = st.fixed_dictionaries({"type": st.just("input_text"), "text": TEXT})
    said = st.fixed_dictionaries({"type": st.just("output_text"), "text": TEXT})
    message = st.fixed_dictionaries({"role": st.sampled_from(("user", "system", "developer")),
                                     "content": TEXT | st.lists(part, max_size=2)})
    answer = st.fixed_dictionaries({"type": st.just("message"), "role": st.just("assistant"),
                                    "content": st.lists(said, max_size=2)})
    arguments = st.dictionaries(NAMES, st.integers() | TEXT, max_size=2).map(json.dumps)
    call = st.fixed_dictionaries({"type": st.just("function_call"), "call_id": NAMES, "name": NAMES,
                                  "arguments": arguments})
    output = st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": NAMES, "output": TEXT})
    return st.lists(st.one_of(message, message, answer, call, output), min_size=1, max_size=3)


@st.composite
def valid_responses(draw, vocab: int) -> dict:
    optional = {"instructions": TEXT, "temperature": st.floats(0, 2), "top_p": st.floats(0, 1, exclude_min=True),
                "stream": st.booleans(), "store": st.booleans(), "metadata": JUNK, "user": TEXT, "model": TEXT,
                "text": st.just({"format": {"type": "text"}}), "truncation": st.just("disabled"),
                "include": st.just([]), "top_logprobs": st.just(0), "background": st.just(False),
                "parallel_tool_calls": st.booleans()}
    return draw(st.fixed_dictionaries({"input": WORDS | response_items(), "max_output_tokens": NEW_TOKENS},
                                      optional=optional))


@st.composite
def broken_item(draw, index: int) -> tuple[Any, str]:
    where = f"input[{index}]"
    kind = draw(st.sampled_from(["junk", "type", "role", "extra", "content", "part", "arguments", "call_id",
                                 "surrogate", "image"]))
    if kind == "junk":
        return draw(JUNK.filter(lambda v: not isinstance(v, dict))), where
    if kind == "type":
        return {"type": draw(WORDS.filter(lambda t: t not in ("message", "function_call", "function_call_output",
                                                               "reasoning")))}, f"{where}.type"
    if kind == "role":
        return {"role": draw(WORDS.filter(lambda r: r not in ("user", "system", "developer", "assistant"))),
                "content": "a"}, f"{where}.role"
    if kind == "extra":
        name = draw(NAMES.filter(lambda n: n not in ("type", "role", "content", "id", "status")))
        return {"role": "user", "content": "a", name: draw(SOME_JUNK)}, f"{where}.{name}"
    if kind == "content":
        return {"role": "user", "content": draw(SOME_JUNK.filter(lambda v: not isinstance(v, str | list)))}, \
            f"{where}.content"
    if kind == "part":
        part = draw(JUNK.filter(lambda v: not (isinstance(v, dict) and v.get("type") in (
            "input_text", "output_text", "refusal", "input_image"))))
        return {"role": "user", "content": [{"type": "input_text", "text": "a"}, part]}, f"{where}.content[1]"
    if kind == "arguments":
        bad = TEXT.filter(lambda t: not _is_json_object(t)) | SOME_JUNK.filter(lambda v: not isinstance(v, str | dict))
        return {"type": "function_call", "call_id": "c", "name": "f", "arguments": draw(bad)}, f"{where}.arguments"
    if kind == "call_id":
        return {"type": "function_call_output", "call_id": draw(SOME_JUNK.filter(lambda v: not isinstance(v, str))),
                "output": "x"}, f"{where}.call_id"
    if kind == "image":
        url = draw(TEXT.filter(lambda u: not u.startswith("data:")))
        return {"role": "user", "content": [{"type": "input_image", "image_url": url}]}, f"{where}.content[0]"
    return {"role": "user", "content": draw(LONE_SURROGATE_TEXT)}, where


@st.composite
def responses_cases(draw, vocab: int) -> Case:
    body = draw(valid_responses(vocab))
    kind = draw(st.sampled_from(["rule", "item", "valid", "unknown", "refused", "input", "previous", "valid",
                                 "text", "tools"]))
    if kind == "valid":
        return Case(body, "valid")
    if kind == "rule":
        name = draw(st.sampled_from(sorted(RESPONSES_RULES)))
        return Case({**body, name: draw(breaking(RESPONSES_RULES[name]))}, "bad", name)
    if kind == "unknown":
        name = draw(NAMES.filter(lambda n: n not in field_names(RESPONSES_API)))
        return Case({**body, name: draw(SOME_JUNK)}, "bad", name)
    if kind == "refused":
        name, value = draw(refused_row(RESPONSES_API))
        return Case({**body, name: value}, "bad", name)
    if kind == "input":
        bad = SOME_JUNK.filter(lambda v: not isinstance(v, str | list)) | st.just([])
        return Case({**body, "input": draw(bad)}, "bad", "input")
    if kind == "previous":
        return Case({**body, "previous_response_id": draw(TEXT)}, "bad", "previous_response_id")
    if kind == "item":
        items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
        index = draw(st.integers(0, len(items)))
        wrong, param = draw(broken_item(index))
        return Case({**body, "input": [*items[:index], wrong, *items[index:]]}, "bad", param)
    if kind == "text":
        form = st.fixed_dictionaries({"type": st.sampled_from(["json_schema", "json_object", "yaml"])},
                                     optional={"name": NAMES, "schema": JUNK})
        return Case({**body, "text": draw(SOME_JUNK.filter(lambda v: not isinstance(v, dict))
                                          | st.fixed_dictionaries({"format": form}))}, "either", "text")
    tools = st.lists(st.fixed_dictionaries({"type": st.just("function"), "name": NAMES},
                                           optional={"parameters": JUNK, "description": JUNK}), max_size=2)
    choice = st.sampled_from(["none", "auto", "required"]) | JUNK
    return Case({**body, "tools": draw(tools), "tool_choice": draw(choice)}, "either", "tool")


# ---- the check -------------------------------------------------------------------------------------

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "tokenize": "/tokenize",
         "detokenize": "/detokenize", "messages": "/v1/messages", "responses": "/v1/responses"}


@pytest.fixture(scope="module")
def server():
    model = llm.create(demo_model_dir() / "config.json")
    model.set_config({"thread_num": 2})
    model.load()
    with TestClient(create_app(ServedModel(model, "demo")), raise_server_exceptions=False) as client:
        yield client, model.embedding.vocab_size


def names(param: str | None, field: str) -> bool:
    """Whether an error's param names `field`: the field itself, or a part of it."""
    return param is not None and (param == field or param.startswith((f"{field}.", f"{field}[")))


def check(client: TestClient, endpoint: str, case: Case) -> int:
    """Send `case`, check its response, and return the status."""
    response = client.post(PATHS[endpoint], content=case.raw(), headers={"content-type": "application/json"})
    status = response.status_code
    assert status != 500, f"{case}: {response.text}"
    if case.expect == "valid" or (case.expect == "either" and status == 200):
        assert status == 200, f"{case}: {response.text}"
        check_reply(endpoint, json.loads(case.body) if isinstance(case.body, bytes) else case.body, response)
        return status
    assert status in (400, 422), f"{case}: {status} {response.text}"
    error = response.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error", f"{case}: {error}"
    if endpoint == "messages":   # Anthropic's shape: {"type": "error", "error": {"type", "message", "param"}}
        assert response.json()["type"] == "error" and "code" not in error, f"{case}: {error}"
    if case.expect == "not_json":
        assert error["param"] is None, f"{case}: {error}"
    elif case.expect == "too_deep":
        deep = "levels deep" in error["message"] if endpoint == "messages" else error["code"] == "nested_too_deep"
        assert status == 400 and deep and error["param"] is None, f"{case}: {error}"
    elif case.expect == "either" and case.param == "tool":
        assert names(error["param"], "tools") or names(error["param"], "tool_choice"), f"{case}: {error}"
    else:
        assert names(error["param"], case.param), f"{case}: expected param {case.param!r}: {error}"
    return status


def check_reply(endpoint: str, body: dict, response) -> None:
    if endpoint == "tokenize":
        reply = response.json()
        assert reply["count"] == len(reply["tokens"])
        return
    if endpoint == "detokenize":
        assert isinstance(response.json()["prompt"], str)
        return
    if endpoint in ("messages", "responses"):
        check_agent_reply(endpoint, body, response)
        return
    if body.get("stream"):
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.text.rstrip().endswith("data: [DONE]") and '"error"' not in response.text, response.text
        return
    prompts = body["prompt"] if endpoint == "completions" else [body["messages"]]
    if endpoint == "completions" and (isinstance(prompts, str) or all(is_int(i) for i in prompts)):
        prompts = [prompts]
    choices = response.json()["choices"]
    assert len(choices) == len(prompts) * body.get("n", 1)
    assert all(c["finish_reason"] in ("stop", "length", "tool_calls") for c in choices), choices


def check_agent_reply(endpoint: str, body: dict, response) -> None:
    """A Messages reply ends with message_stop (streamed) or has its content and stop_reason; a
    Responses reply ends with response.completed or .incomplete, or has its output and status."""
    if body.get("stream"):
        assert response.headers["content-type"].startswith("text/event-stream")
        last = response.text.rstrip().rsplit("\n\n", 1)[-1]
        ends = ("event: message_stop",) if endpoint == "messages" else ("event: response.completed",
                                                                        "event: response.incomplete")
        assert last.startswith(ends) and "event: error" not in response.text, response.text
        return
    reply = response.json()
    if endpoint == "messages":
        assert reply["type"] == "message" and reply["content"], reply
        assert reply["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence", "tool_use"), reply
    else:
        assert reply["object"] == "response" and reply["output"], reply
        assert reply["status"] in ("completed", "incomplete"), reply


# each fuzz test's responses, counted by status as they come back: the last test adds them up
RESPONSES: dict[str, Counter] = {}


def run_fuzz(server, endpoint: str, cases) -> None:
    client, vocab = server
    sent = []
    statuses = RESPONSES[endpoint] = Counter()

    @settings(FUZZ_SETTINGS, max_examples=EXAMPLES[endpoint])
    @given(case=cases(vocab))
    def fuzz(case):
        sent.append(case.expect)
        statuses[check(client, endpoint, case)] += 1

    fuzz()
    assert {"valid", "bad"} <= set(sent)   # both kinds were tried, so neither check passes by being skipped
    assert_answered(statuses, EXAMPLES[endpoint], {200, 400})


def assert_answered(statuses: Counter, at_least: int, seen: set[int]) -> None:
    """At least `at_least` responses came back, each with a status the cases allow, and each of `seen`
    among them."""
    assert sum(statuses.values()) >= at_least, statuses
    assert set(statuses) <= {200, 400, 422} and seen <= set(statuses), statuses


def test_chat_completion_bodies(server):
    run_fuzz(server, "chat", chat_cases)


def test_completion_bodies(server):
    run_fuzz(server, "completions", completion_cases)


def test_tokenize_bodies(server):
    run_fuzz(server, "tokenize", tokenize_cases)


def test_detokenize_bodies(server):
    run_fuzz(server, "detokenize", detokenize_cases)


def test_anthropic_messages_bodies(server):
    run_fuzz(server, "messages", messages_cases)


def test_openai_responses_bodies(server):
    run_fuzz(server, "responses", responses_cases)


def test_bodies_that_are_not_json_objects(server):
    client, _ = server
    sent = []
    statuses = RESPONSES["not_json"] = Counter()

    @settings(FUZZ_SETTINGS, max_examples=EXAMPLES["not_json"])
    @given(endpoint=st.sampled_from(sorted(PATHS)), raw=not_json_bodies())
    def fuzz(endpoint, raw):
        sent.append(raw)
        statuses[check(client, endpoint, Case(raw, "not_json"))] += 1

    fuzz()
    assert len(sent) >= EXAMPLES["not_json"]
    assert_answered(statuses, EXAMPLES["not_json"], {400})


def limit_examples(test):
    """`test` with LIMIT_CASES as explicit examples, which hypothesis always runs."""
    for nested in LIMIT_CASES:
        test = example(nested=nested)(test)
    return test


def test_bodies_nested_deep(server):
    client, vocab = server
    drawn = Counter()
    statuses = RESPONSES["nested"] = Counter()

    @settings(FUZZ_SETTINGS, max_examples=EXAMPLES["nested"])
    @given(nested=nested_cases(vocab))
    @limit_examples
    def fuzz(nested):
        endpoint, case = nested
        if nested not in LIMIT_CASES:
            drawn[endpoint, case.expect] += 1
        statuses[check(client, endpoint, case)] += 1

    fuzz()
    # the draws sent every endpoint bodies past the limit and within it, so neither side passes by
    # being skipped
    assert {(endpoint, expect) for endpoint in PATHS for expect in ("too_deep", "either")} <= set(drawn), drawn
    assert_answered(statuses, EXAMPLES["nested"], {200, 400})


def test_the_fuzz_sent_at_least_5000_requests():
    """The responses the fuzz tests above counted (pytest runs a file's tests in order): at least 5,000
    in all, each with an allowed status, and replies as well as refusals among them."""
    missing = sorted(set(EXAMPLES) - set(RESPONSES))
    if missing:
        pytest.skip(f"adds up the other fuzz tests' responses, and {missing} did not run before it")
    assert_answered(sum(RESPONSES.values(), Counter()), 5000, {200, 400})
