"""Tool calls: OpenAI's `tools` and `tool_choice`, the model's own chat template, and the calls its
reply holds.

The tools reach the chat template as its `tools` variable, as transformers passes them, so the
model reads them in the words it was trained on. The reply is read in the Hermes format of
Qwen's templates:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

    ToolRequest        the request's tools, tool_choice and parallel_tool_calls, checked
    ToolCallParser     turns a reply's text, piece by piece, into content and tool-call deltas
                       (the same deltas build a whole reply and a stream)

tool_choice "none" leaves the tools out of the prompt; "auto" lets the model choose; "required"
and a named function are enforced by a grammar (structured.py) that writes one call (or, with
parallel_tool_calls, one or more) of the allowed functions, with arguments valid against each
function's parameters schema.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from mnngpu.apps.server.structured import GrammarSpec, json_schema_lark, lark_grammar
from mnngpu.errors import InputError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
FUNCTION_KEYS = ("name", "description", "parameters", "strict")
# a call's opening as the Hermes format writes it, up to where the arguments' value starts
CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict]       # as the chat template gets them: {"type": "function", "function": {...}}
    choice: str             # "none", "auto", "required" or "function" (the one `named`)
    named: str | None = None
    parallel: bool = True

    @property
    def names(self) -> list[str]:
        return [tool["function"]["name"] for tool in self.tools]

    @property
    def in_prompt(self) -> list[dict] | None:
        """The tools the chat template renders; None with tool_choice "none"."""
        return None if self.choice == "none" else self.tools

    def check_template(self, template: str | None) -> None:
        _check_template(template)

    def grammar(self) -> GrammarSpec | None:
        """The grammar that makes the reply a call: for "required" and a named function only."""
        if self.choice not in ("required", "function"):
            return None
        functions = [tool["function"] for tool in self.tools if self.choice == "required"
                     or tool["function"]["name"] == self.named]
        rules = [f"f{i}: {json_schema_lark(_call_schema(f))}" for i, f in enumerate(functions)]
        calls = 'call ("\\n" call)*' if self.parallel else "call"
        body = " | ".join(f"f{i}" for i in range(len(functions)))
        lark = "\n".join([f"start: {calls}", f'call: "{OPEN}\\n" ({body}) "\\n{CLOSE}"', *rules])
        return lark_grammar(lark, "tools")


def _call_schema(function: dict) -> dict:
    """The JSON of one call: its name, then arguments valid against the function's parameters."""
    return {"type": "object", "properties": {"name": {"const": function["name"]},
                                             "arguments": function.get("parameters") or {"type": "object"}},
            "required": ["name", "arguments"], "additionalProperties": False}


def parse_tool_request(tools: Any, choice: Any, parallel: Any) -> ToolRequest | None:
    """The request's tool fields, checked; None when it offers no tools."""
    if parallel is not None and not isinstance(parallel, bool):
        raise InputError(f"expected true or false, got {parallel!r}", field="parallel_tool_calls")
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise InputError("a tool_choice needs tools", field="tool_choice")
        return None
    if not isinstance(tools, list):
        raise InputError("expected a list of {\"type\": \"function\", \"function\": {...}}", field="tools")
    checked = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    names = [tool["function"]["name"] for tool in checked]
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        raise InputError(f"two tools are named '{twice}'", field="tools")
    kind, named = _choice(choice, names)
    return ToolRequest(checked, kind, named, True if parallel is None else parallel)


def _tool(tool: Any, param: str) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise InputError('expected {"type": "function", "function": {...}} (only function tools are supported)',
                         field=param)
    unknown = next((key for key in tool if key not in ("type", "function")), None)
    if unknown is not None:
        raise InputError(f"unknown key '{unknown}'", field=f"{param}.{unknown}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise InputError("expected an object with 'name' and 'parameters'", field=f"{param}.function")
    unknown = next((key for key in function if key not in FUNCTION_KEYS), None)
    if unknown is not None:
        raise InputError(f"unknown key '{unknown}' (expected {', '.join(FUNCTION_KEYS)})",
                         field=f"{param}.function.{unknown}")
    name = function.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InputError("expected a name of 1 to 64 letters, digits, _ or -", field=f"{param}.function.name")
    if not isinstance(function.get("description", ""), str):
        raise InputError("expected a string", field=f"{param}.function.description")
    if not isinstance(function.get("parameters", {}), dict):
        raise InputError("expected a JSON schema object", field=f"{param}.function.parameters")
    if not isinstance(function.get("strict", False), bool | None):
        raise InputError("expected true or false", field=f"{param}.function.strict")
    return {"type": "function", "function": function}


def _choice(choice: Any, names: list[str]) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if choice in ("none", "auto", "required"):
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise InputError(f"no tool is named {name!r}; the tools are {names}", field="tool_choice.function.name")
        return "function", name
    raise InputError('expected "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
                     field="tool_choice")


# How to give a model a template that renders tools, said with each refusal of `tools`.
TEMPLATE_HINT = (f"; give it one that does as `jinja.chat_template` in the model folder's llm_config.json, or "
                 f"with mnngpu serve --config 'jinja={{\"chat_template\": \"...\"}}' (it gets the tools as its "
                 f"`tools` variable and must write calls as {OPEN}...{CLOSE})")


def _check_template(template: str | None) -> None:
    """Tools need a chat template that renders them and writes calls in the Hermes format."""
    if not template or "tools" not in template:
        raise InputError("the model's chat template does not render tools (it never reads `tools`), so the "
                         "model cannot be told about them" + TEMPLATE_HINT, field="tools")
    if OPEN not in template:
        raise InputError(f"the model's chat template does not write calls as {OPEN}...{CLOSE} (the Hermes "
                         "format), the only one read here" + TEMPLATE_HINT, field="tools")


# ---- reading the calls in a reply ---------------------------------------------------------------------


@dataclass
class ToolCallDelta:
    index: int
    id: str | None = None       # with the name, in a call's first delta
    name: str | None = None
    arguments: str = ""

    def body(self) -> dict:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Deltas:
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)   # one per call index

    def add(self, delta: ToolCallDelta) -> None:
        if self.calls and self.calls[-1].index == delta.index:
            self.calls[-1].arguments += delta.arguments
        else:
            self.calls.append(delta)

    def extend(self, other: Deltas) -> None:
        self.content += other.content
        for delta in other.calls:
            self.add(delta)

    def tool_calls(self) -> list[dict]:
        """The whole calls, once every delta of a reply is in."""
        return [delta.body() for delta in self.calls]


class ToolCallParser:
    """feed(text) -> Deltas, finish() -> Deltas. Text outside <tool_call> blocks is content; a
    block that opens with {"name": ONE_OF_THE_TOOLS, "arguments": ...} is a call whose arguments
    are streamed as the model writes them (without `parallel`, calls after the first are dropped);
    any other block stays content. Whitespace next to a
    call is not content, and a reply with no call comes back exactly as written."""

    def __init__(self, names: list[str], parallel: bool = True):
        self.names, self.parallel = set(names), parallel
        self.calls = 0
        self._mode = "text"      # text | head (block opened, name unread) | arguments | tail (up to CLOSE)
        self._pending = ""       # text not handled yet
        self._blank = ""         # whitespace held until something other than a call follows it
        self._scanner: _ValueEnd | None = None

    def feed(self, text: str) -> Deltas:
        out = Deltas()
        self._pending += text
        while self._step(out):
            pass
        return out

    def finish(self) -> Deltas:
        out = Deltas()
        if self._mode == "text":
            self._content(out, self._pending)
            if not self.calls:
                out.content += self._blank
        elif self._mode == "head":
            self._content(out, OPEN + self._pending)
        self._pending = self._blank = ""
        return out

    def _step(self, out: Deltas) -> bool:
        """Handle what `_pending` holds as far as it can; True if the mode changed (go on)."""
        if self._mode == "text":
            at = self._pending.find(OPEN)
            if at < 0:
                keep = _partial_suffix(self._pending, OPEN)
                self._content(out, self._pending[:len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep:]
                return False
            self._content(out, self._pending[:at])
            self._pending, self._mode = self._pending[at + len(OPEN):], "head"
            return True
        if self._mode == "head":
            return self._head(out)
        if self._mode == "arguments":
            return self._arguments(out)
        at = self._pending.find(CLOSE)   # tail: what follows the arguments' value, up to the close
        if at < 0:
            return False
        self._pending, self._mode = self._pending[at + len(CLOSE):], "text"
        return True

    def _head(self, out: Deltas) -> bool:
        head = CALL_HEAD.match(self._pending)
        close = self._pending.find(CLOSE)
        if head is not None and (close < 0 or head.end() <= close):
            name = json.loads(f'"{head.group(1)}"')
            if name in self.names and self.calls and not self.parallel:   # one call at most: drop the rest
                self._pending, self._mode, self._blank = self._pending[head.end():], "tail", ""
                return True
            if name in self.names:
                out.add(ToolCallDelta(self.calls, "call_" + uuid.uuid4().hex[:24], name))
                self.calls += 1
                self._pending, self._mode, self._scanner = self._pending[head.end():], "arguments", _ValueEnd()
                self._blank = ""
                return True
        if close >= 0:   # a block that is not a call of these tools: content, as written
            self._content(out, OPEN + self._pending[:close + len(CLOSE)])
            self._pending, self._mode = self._pending[close + len(CLOSE):], "text"
            return True
        return False

    def _arguments(self, out: Deltas) -> bool:
        if not self._scanner.started:
            self._pending = self._pending.lstrip()
        taken = self._scanner.feed(self._pending)
        if taken:
            out.add(ToolCallDelta(self.calls - 1, arguments=self._pending[:taken]))
        self._pending = self._pending[taken:]
        if self._scanner.done:
            self._mode = "tail"
            return True
        return False

    def _content(self, out: Deltas, text: str) -> None:
        """Content, with whitespace held back while it may be all that stands before a call."""
        text = self._blank + text
        stripped = text.rstrip()
        if not stripped:
            self._blank = text
            return
        out.content += stripped
        self._blank = text[len(stripped):]


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest tail of `text` that `marker` starts with (and is not all of it)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class _ValueEnd:
    """Finds where one JSON value ends in text given piece by piece: feed() says how many of the
    characters belong to the value; `done` once it is whole."""

    def __init__(self):
        self.depth = 0
        self.started = self.scalar = self.done = False
        self.in_string = self.escaped = False

    def feed(self, text: str) -> int:
        for position, char in enumerate(text):
            if self.done:
                return position
            if not self.started:
                if char.isspace():
                    continue
                self.started, self.scalar = True, char not in '{["'
            if self.scalar:   # a bare number, true, false or null ends at what cannot be in it
                if char in ",}] \t\r\n":
                    self.done = True
                    return position
            elif self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
                    self.done = self.depth == 0
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                self.done = self.depth == 0
        return len(text)
