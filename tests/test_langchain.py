"""LangChain's OpenAI chat model against `mnngpu serve`: with_structured_output returns a parsed
object of the schema, and bind_tools returns a tool call.

Truths: pydantic validates the object LangChain parses (the schema's bounds included), and
`jsonschema` checks the call's arguments against the tool's parameters as LangChain sent them.
"""

from __future__ import annotations

import json
import typing

import pytest

langchain_openai = pytest.importorskip("langchain_openai")
pydantic = pytest.importorskip("pydantic")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

from langchain_core.utils.function_calling import convert_to_openai_tool

from tests.serving import ServeProcess
from tests.test_server_fields import tools_template


class Person(pydantic.BaseModel):
    """A person."""

    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=150)
    likes_cats: bool


class get_weather(pydantic.BaseModel):   # a tool's name, as the model sees it
    """The weather in a city."""

    city: str = pydantic.Field(max_length=10, description="the city's name")
    unit: typing.Literal["C", "F"]


@pytest.fixture(scope="module")
def chat_model():
    jinja = json.dumps({"chat_template": tools_template(), "eos": "<|im_end|>"})
    process = ServeProcess("--quiet", "--config", f"jinja={jinja}")
    yield langchain_openai.ChatOpenAI(base_url=f"http://127.0.0.1:{process.port}/v1", api_key="x", model="any",
                                      temperature=0, max_tokens=120, max_retries=0)
    process.kill()


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_returns_a_parsed_object(chat_model, method):
    person = chat_model.with_structured_output(Person, method=method).invoke("Describe a person.")
    assert isinstance(person, Person)
    Person.model_validate(person.model_dump())   # the bounds hold


def test_with_structured_output_strict_streams_a_parsed_object(chat_model):
    chunks = list(chat_model.with_structured_output(Person, method="json_schema", strict=True).stream("A person?"))
    assert chunks and isinstance(chunks[-1], Person)


@pytest.mark.parametrize("tool_choice", ["required", "get_weather"])
def test_bind_tools_returns_a_tool_call(chat_model, tool_choice):
    message = chat_model.bind_tools([get_weather], tool_choice=tool_choice).invoke("Weather in Paris?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
    parameters = convert_to_openai_tool(get_weather)["function"]["parameters"]
    for call in message.tool_calls:
        jsonschema.validate(call["args"], parameters)
