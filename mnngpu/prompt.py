"""The chat prompt: render a model's jinja chat template the way MNN's engine renders it.

MNN renders `jinja.chat_template` with its own small jinja engine. We render with jinja2,
set up to give MNN's text:

- The template's text and whitespace control are cut by a port of MNN's lexing rules
  (`_translate`), then handed to jinja2 as tags only, so jinja2's own trimming never applies.
- Block tags MNN does not know (`break`, `continue`, `raw`, `generation`, ...) are dropped,
  as MNN skips them.
- Filters, tests, string methods, subscripts, undefined values and printing follow MNN
  (`MnnEnvironment`); a filter MNN lacks passes its value through, a test MNN lacks is false.

Where MNN's parser itself falls short of jinja (it has no `*`, `/` or `%`, no float
literals, no method or subscript after a literal) we keep jinja2's meaning;
docs/sampling.md lists those differences.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from mnngpu.errors import ConfigError, InputError

TEMPLATE_FIELD = "jinja.chat_template"
_TEXT_TABLE = "__mnngpu_text"  # the template's literal text, printed by index
_WHITESPACE = " \n\r\t"  # what MNN's trimming removes
_KNOWN_BLOCKS = frozenset({"for", "endfor", "if", "elif", "else", "endif", "set", "macro", "endmacro"})
_FIRST_WORD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)")
_CONTENT_PROBE = "<__jinja_content_probe__>"


class Prompt:
    """Turns a user message or a chat into the prompt text the model is given.

    `config` is the merged model config as a plain dict. It reads `jinja.chat_template`,
    `jinja.eos`, `jinja.bos`, `jinja.context` (context.json already merged in), `asr_language` (a
    template variable), `system_prompt` and `use_template`.

    MNN also reads a template, eos and bos from a `.mtok` tokenizer file. Pass them as
    `tokenizer_template`, `tokenizer_eos` and `tokenizer_bos`: the config's template and eos
    win over the tokenizer's, as in MNN, while `bos_token` comes from the tokenizer only.
    When `tokenizer_bos` is not given, `jinja.bos` stands in for it (the exporter writes
    the same token to both).
    """

    def __init__(self, config: Mapping[str, Any], *, tokenizer_template: str = "", tokenizer_eos: str = "",
                 tokenizer_bos: str | None = None):
        jinja = config.get("jinja", {})
        if not isinstance(jinja, Mapping):
            raise ConfigError(f"expected an object with chat_template, bos, eos, context, got {jinja!r}",
                              field="jinja")
        if "chat_template" in jinja:
            self.template_source = _expect_str(jinja["chat_template"], TEMPLATE_FIELD)
            self.eos = _expect_str(jinja.get("eos", ""), "jinja.eos")
        else:
            self.template_source, self.eos = tokenizer_template, tokenizer_eos
        bos = tokenizer_bos if tokenizer_bos is not None else jinja.get("bos", "")
        self.bos = _expect_str(bos, "jinja.bos")
        context = jinja.get("context", {})
        self.context = dict(context) if isinstance(context, Mapping) else {}
        if "asr_language" in config:   # as MNN after 3.6.1: a template variable beside jinja.context
            self.context["asr_language"] = _expect_str(config["asr_language"], "asr_language")
        self.system_prompt = _expect_str(config.get("system_prompt", ""), "system_prompt")
        use_template = config.get("use_template", True)
        if not isinstance(use_template, bool):
            raise ConfigError(f"expected true or false, got {use_template!r}", field="use_template")
        self.use_template = use_template
        self._template = _compile(self.template_source) if self.template_source else None
        self._typed_content: bool | None = None

    def apply_chat_template(self, messages: str | list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, variables: Mapping[str, Any] | None = None) -> str:
        """The prompt text MNN's `response()` would tokenize for these messages.

        A string is one user turn: with `use_template` false it is returned as it is,
        otherwise it gets `system_prompt` (when set) and the template. A list of messages
        is always rendered as given, as MNN does. `tools` (OpenAI's function tools) are the
        template's `tools` variable, as transformers' apply_chat_template passes them;
        `variables` (a request's chat_template_kwargs, e.g. enable_thinking) override jinja.context.
        """
        if isinstance(messages, str):
            if not self.use_template:
                return messages
            turns = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            rendered = self.render([*turns, {"role": "user", "content": messages}], add_generation_prompt, tools,
                                   variables)
            return rendered or messages  # MNN falls back to the bare text when the template is empty
        return self.render(messages, add_generation_prompt, tools, variables)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict] | None = None, variables: Mapping[str, Any] | None = None) -> str:
        """MNN's apply_chat_template for a list of messages: no system_prompt, no use_template.

        A message is a dict with a string "role". A message with role "json" whose content
        is a JSON object stands for that object, as in MNN's (role, content) API. `tools`,
        when given, replace any the config's jinja.context holds; so do `variables`.
        """
        chat = _normalise_messages(messages)
        if self._template is None:  # MNN joins the contents as they were passed in
            return "".join(m["content"] for m in messages if isinstance(m.get("content"), str))
        if self._needs_typed_content():
            chat = [_as_typed_parts(m) for m in chat]
        given = {**self._defaults(), **self.context, **(variables or {}), "messages": chat}
        if tools is not None:
            given["tools"] = tools
        if add_generation_prompt:
            given["add_generation_prompt"] = True  # MNN leaves it undefined otherwise
        return _render(self._template, given)

    def _defaults(self) -> dict[str, Any]:
        defaults: dict[str, Any] = {"eos_token": self.eos}
        if self.bos:
            defaults["bos_token"] = self.bos
        return defaults

    def _needs_typed_content(self) -> bool:
        # MNN renders a probe message both ways: a template that shows only the typed one
        # expects content as a list of {"type": "text", "text": ...} parts.
        if self._typed_content is None:
            plain = [{"role": "user", "content": _CONTENT_PROBE}]
            typed = [{"role": "user", "content": [{"type": "text", "text": _CONTENT_PROBE}]}]
            self._typed_content = (_CONTENT_PROBE not in self._probe(plain)
                                   and _CONTENT_PROBE in self._probe(typed))
        return self._typed_content

    def _probe(self, messages: list[dict]) -> str:
        try:
            return _render(self._template, {**self._defaults(), "messages": messages})
        except ConfigError:
            return ""


def _expect_str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"expected a string, got {value!r}", field=field)
    return value


def _normalise_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InputError(f"expected a string or a list of messages, got {type(messages).__name__}",
                         field="messages")
    chat = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise InputError(f"expected an object with a string 'role', got {message!r}",
                             field=f"messages[{index}]")
        chat.append(_unwrap_json_role(copy.deepcopy(dict(message))))
    return chat


def _unwrap_json_role(message: dict) -> dict:
    # MNN's way to pass a whole message object through (role, content) pairs.
    if message["role"] == "json" and isinstance(message.get("content"), str):
        try:
            parsed = json.loads(message["content"])
        except json.JSONDecodeError:
            return message
        if isinstance(parsed, dict):
            return parsed
    return message


def _as_typed_parts(message: dict) -> dict:
    content = message.get("content")
    if isinstance(content, str) and content:
        return {**message, "content": [{"type": "text", "text": content}]}
    return message


# ---------------------------------------------------------------------------------------------
# MNN's lexing rules, ported: text and whitespace control are decided here
# ---------------------------------------------------------------------------------------------


def _translate(template: str) -> tuple[str, list[str]]:
    """jinja2 source with the template's text replaced by lookups into the returned list.

    The rules are MNN's: `{{-`/`{%-`/`{#-` strip the whitespace before a tag, `-}}`/`-%}`/
    `-#}` the whitespace after it; a block tag (not a comment or expression) also drops the
    spaces and tabs before it back to the line start, or to the previous tag when no newline
    comes between; a plain `%}` eats one newline right after it.
    """
    pieces: list[str] = []
    texts: list[str] = []
    cursor, trim_next, size = 0, False, len(template)
    while cursor < size:
        start, kind = _next_tag(template, cursor)
        text = template[cursor:start]
        if trim_next:
            text, trim_next = text.lstrip(_WHITESPACE), False
        if start == size:
            _add_text(pieces, texts, text)
            break
        trim_before = start + 2 < size and template[start + 2] == "-"
        if trim_before:
            text = text.rstrip(_WHITESPACE)
        elif kind == "{%":
            text = _drop_indent(text)
        _add_text(pieces, texts, text)
        body_start = start + 2 + trim_before
        if kind == "{#":
            cursor, trim_next = _skip_comment(template, body_start)
            continue
        body, cursor, trim_next = _read_tag(template, body_start, kind)
        if kind == "{{":
            pieces.append("{{" + body + "}}")
        elif (word := _FIRST_WORD.match(body)) and word.group(1) in _KNOWN_BLOCKS:
            pieces.append("{%" + body + "%}")
    return "".join(pieces), texts


def _next_tag(template: str, cursor: int) -> tuple[int, str]:
    found = [(pos, mark) for mark in ("{{", "{%", "{#") if (pos := template.find(mark, cursor)) >= 0]
    return min(found) if found else (len(template), "")


def _add_text(pieces: list[str], texts: list[str], text: str) -> None:
    if text:
        pieces.append(f"{{{{ {_TEXT_TABLE}[{len(texts)}] }}}}")
        texts.append(text)


def _drop_indent(text: str) -> str:
    line_start = text.rfind("\n") + 1
    indent = text[line_start:]
    if indent and indent.strip(" \t") == "":
        return text[:line_start]
    return text


def _skip_comment(template: str, cursor: int) -> tuple[int, bool]:
    while cursor < len(template):
        if template.startswith("#}", cursor):
            return cursor + 2, False
        if template.startswith("-#}", cursor):
            return cursor + 3, True
        cursor += 1
    return cursor, False


def _read_tag(template: str, cursor: int, kind: str) -> tuple[str, int, bool]:
    """(tag body, position after the tag, whether the tag trims what follows)."""
    close = "}}" if kind == "{{" else "%}"
    start, size = cursor, len(template)
    while cursor < size:
        char = template[cursor]
        if char in "'\"":
            cursor = _skip_string(template, cursor)
        elif template.startswith("-" + close, cursor):
            return template[start:cursor], cursor + 3, True
        elif template.startswith(close, cursor):
            after = cursor + 2
            if kind == "{%" and after < size and template[after] == "\n":
                after += 1
            return template[start:cursor], after, False
        else:
            cursor += 1
    raise ConfigError(f"a tag opened with {kind!r} at offset {start - 2} is never closed", field=TEMPLATE_FIELD)


def _skip_string(template: str, cursor: int) -> int:
    quote, cursor = template[cursor], cursor + 1
    while cursor < len(template) and template[cursor] != quote:
        cursor += 2 if template[cursor] == "\\" else 1
    return cursor + 1


# ---------------------------------------------------------------------------------------------
# The jinja2 environment with MNN's values, filters and tests
# ---------------------------------------------------------------------------------------------


class MnnUndefined(jinja2.ChainableUndefined):
    """MNN's undefined: prints nothing, any attribute is undefined, calling it gives ""."""

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        return ""

    def __add__(self, other: Any) -> str:
        return ""

    __radd__ = __sub__ = __rsub__ = __add__


class _FallbackTable(dict):
    """A filter or test table that answers every name: unknown names get `fallback`."""

    def __init__(self, known: Mapping[str, Any], fallback: Any):
        super().__init__(known)
        self.fallback = fallback

    def __missing__(self, name: str) -> Any:
        return self.fallback

    def __contains__(self, name: object) -> bool:
        return True

    def get(self, name: str, default: Any = None) -> Any:
        return self[name]


class MnnEnvironment(ImmutableSandboxedEnvironment):
    """jinja2, sandboxed, with MNN's subscripts, attributes and string methods."""

    def __init__(self) -> None:
        super().__init__(undefined=MnnUndefined, finalize=_printed, autoescape=False)
        self.filters = _FallbackTable(_FILTERS, _pass_through)
        self.tests = _FallbackTable(_TESTS, _never)
        self.globals = {"range": _range, "namespace": Namespace, "strftime_now": _strftime_now}

    def getitem(self, obj: Any, argument: Any) -> Any:
        # MNN indexes only lists and objects; a missing key or index gives "" (a defined value).
        if isinstance(obj, list | tuple):
            if isinstance(argument, slice):
                return list(obj[argument])
            if isinstance(argument, int) and not isinstance(argument, bool) and -len(obj) <= argument < len(obj):
                return obj[argument]
        elif isinstance(obj, dict) and isinstance(argument, str) and argument in obj:
            return obj[argument]
        return ""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, dict):
            return obj[attribute] if attribute in obj else self.undefined(obj=obj, name=attribute)
        if isinstance(obj, list | tuple):
            return len(obj) if attribute == "length" else self.undefined(obj=obj, name=attribute)
        if isinstance(obj, str):
            method = _STRING_METHODS.get(attribute)
            if method is None:
                return self.undefined(obj=obj, name=attribute)
            return lambda *args: method(obj, *args)
        return super().getattr(obj, attribute)


def _compile(source: str) -> jinja2.Template:
    translated, texts = _translate(source)
    try:
        return _ENVIRONMENT.from_string(translated, globals={_TEXT_TABLE: texts})
    except jinja2.TemplateSyntaxError as error:
        raise ConfigError(f"the chat template does not parse: {error.message}", field=TEMPLATE_FIELD) from None


def _render(template: jinja2.Template, variables: dict[str, Any]) -> str:
    try:
        return template.render(variables)
    except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError) as error:
        raise ConfigError(f"the chat template failed to render: {error}", field=TEMPLATE_FIELD) from None


# --- printing values the way MNN's JSON library writes them ----------------------------------


def _printed(value: Any) -> Any:
    """What `{{ value }}` shows: strings as they are, anything else as compact JSON."""
    if isinstance(value, str | jinja2.Undefined):
        return value
    if isinstance(value, bool | int | float | list | tuple | dict) or value is None:
        return _compact_json(value)
    return value


def _compact_json(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(_json_string(str(k)) + ":" + _compact_json(v) for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_compact_json(v) for v in value) + "]"
    return _json_scalar(value)


def _json_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _json_number(value)
    if isinstance(value, jinja2.Undefined):
        return '{"__jinja_undefined__": true}'
    return _json_string(str(value))


def _json_number(value: float) -> str:
    """A double as RapidJSON writes it: shortest digits, fixed notation up to 21 digits."""
    if not math.isfinite(value):
        return "null"
    sign = "-" if str(value).startswith("-") else ""
    if value == 0:
        return sign + "0.0"
    digits_tuple = decimal.Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, digits_tuple.digits))
    exponent = int(digits_tuple.exponent)  # value = digits * 10**exponent
    length, point = len(digits), len(digits) + exponent  # point: digits before the decimal point
    if exponent >= 0 and point <= 21:
        return sign + digits + "0" * exponent + ".0"
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * -point + digits
    mantissa = digits if length == 1 else digits[0] + "." + digits[1:]
    return f"{sign}{mantissa}e{point - 1}"


_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _json_string(text: str) -> str:
    escaped = "".join(_JSON_ESCAPES.get(c, f"\\u{ord(c):04X}" if ord(c) < 0x20 else c) for c in text)
    return '"' + escaped + '"'


def _tool_key_order(key: str) -> tuple[int, str]:
    # MNN's tojson and string filters put the keys of tool schemas in this order.
    priority = {"type": 1, "function": 2, "name": 3, "description": 4, "parameters": 5, "properties": 6,
                "required": 7, "enum": 8}
    return priority.get(key, 100), key


def _tojson(value: Any, indent: int | None = None, level: int = 0) -> str:
    if isinstance(value, dict | list | tuple) and value:
        newline, pad, closing_pad = ("", "", "") if indent is None else (
            "\n", " " * ((level + 1) * indent), " " * (level * indent))
        separator = ", " if indent is None else "," + newline + pad
        if isinstance(value, dict):
            items = [_json_string(k) + ": " + _tojson(value[k], indent, level + 1)
                     for k in sorted(value, key=_tool_key_order)]
            opening, closing = "{", "}"
        else:
            items = [_tojson(v, indent, level + 1) for v in value]
            opening, closing = "[", "]"
        return opening + newline + pad + separator.join(items) + newline + closing_pad + closing
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list | tuple):
        return "[]"
    return _json_scalar(value)


def _python_string(value: Any) -> str:
    """MNN's `string` filter: Python-looking text, with tool keys in MNN's order."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "{" + ", ".join(_python_repr(k) + ": " + _python_repr(value[k])
                               for k in sorted(value, key=_tool_key_order)) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_python_repr(v) for v in value) + "]"
    if isinstance(value, jinja2.Undefined):
        return "{'__jinja_undefined__': True}"
    return _json_scalar(value)


def _python_repr(value: Any) -> str:
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
        return "'" + escaped + "'"
    return _python_string(value)


# --- filters, tests, string methods and functions MNN provides --------------------------------


def _ascii_case(text: str, upper: bool) -> str:
    table = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    if not upper:
        table = {v: k for k, v in table.items()}
    return text.translate(table)


def _filter_tojson(value: Any, *args: Any, indent: Any = None, **kwargs: Any) -> str:
    return _tojson(value, indent if isinstance(indent, int) and not isinstance(indent, bool) and indent >= 0
                   else None)


def _filter_capitalize(value: Any, *args: Any, **kwargs: Any) -> Any:
    if not isinstance(value, str) or not value:
        return value
    return _ascii_case(value[0], True) + _ascii_case(value[1:], False)


def _filter_length(value: Any, *args: Any, **kwargs: Any) -> int:
    if isinstance(value, jinja2.Undefined):
        return 1  # MNN's undefined is an object with one marker key
    if isinstance(value, str):
        return len(value.encode("utf-8"))  # MNN counts bytes
    if isinstance(value, list | tuple | dict):
        return len(value)
    return 0


def _filter_trim(value: Any, *args: Any, **kwargs: Any) -> Any:
    return value.strip(_WHITESPACE) if isinstance(value, str) else value


def _filter_items(value: Any, *args: Any, **kwargs: Any) -> list:
    return [[key, item] for key, item in value.items()] if isinstance(value, dict) else []


def _filter_lower(value: Any, *args: Any, **kwargs: Any) -> Any:
    return _ascii_case(value, False) if isinstance(value, str) else value


def _filter_upper(value: Any, *args: Any, **kwargs: Any) -> Any:
    return _ascii_case(value, True) if isinstance(value, str) else value


def _filter_map(value: Any, *args: Any, attribute: Any = None, **kwargs: Any) -> Any:
    if not isinstance(value, list | tuple):
        return value
    name = attribute if attribute is not None else (args[0] if args else None)
    if not isinstance(name, str) or not name:
        return value
    return [item[name] if isinstance(item, dict) and name in item else None for item in value]


def _pass_through(value: Any, *args: Any, **kwargs: Any) -> Any:
    return value


def _never(value: Any, *args: Any, **kwargs: Any) -> bool:
    return False


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_FILTERS = {
    "tojson": _filter_tojson,
    "string": lambda value, *args, **kwargs: _python_string(value),
    "capitalize": _filter_capitalize,
    "length": _filter_length,
    "trim": _filter_trim,
    "items": _filter_items,
    "lower": _filter_lower,
    "upper": _filter_upper,
    "map": _filter_map,
}

_TESTS = {
    "defined": lambda value, *args: not isinstance(value, jinja2.Undefined),
    "undefined": lambda value, *args: isinstance(value, jinja2.Undefined),
    "none": lambda value, *args: value is None,
    "boolean": lambda value, *args: isinstance(value, bool),
    "string": lambda value, *args: isinstance(value, str),
    "number": lambda value, *args: _is_number(value),
    "sequence": lambda value, *args: isinstance(value, list | tuple | str),
    "iterable": lambda value, *args: isinstance(value, list | tuple | str),
    "mapping": lambda value, *args: isinstance(value, dict),
    "true": lambda value, *args: value is True,
    "false": lambda value, *args: value is False,
}


def _strip_method(side: str):
    def strip(text: str, chars: Any = None) -> str:
        chars = chars if isinstance(chars, str) else _WHITESPACE
        return {"l": text.lstrip, "r": text.rstrip, "": text.strip}[side](chars)
    return strip


def _replace(text: str, old: Any = None, new: Any = None, *args: Any) -> str:
    if not isinstance(old, str) or not isinstance(new, str):
        return ""  # MNN needs both arguments
    return text.replace(old, new) if old else text


def _split(text: str, separator: Any = None, *args: Any) -> list[str]:
    return text.split(separator if isinstance(separator, str) and separator else " ")


def _startswith(text: str, *args: Any) -> Any:
    return text.startswith(str(args[0])) if args else ""


def _endswith(text: str, *args: Any) -> Any:
    return text.endswith(str(args[0])) if args else ""


_STRING_METHODS = {
    "startswith": _startswith,
    "endswith": _endswith,
    "split": _split,
    "lstrip": _strip_method("l"),
    "rstrip": _strip_method("r"),
    "strip": _strip_method(""),
    "replace": _replace,
}


def _range(*args: Any) -> list[int]:
    return list(range(*(int(a) for a in args[:3])))


def _strftime_now(format: str = "%Y-%m-%d", *args: Any) -> str:
    return datetime.datetime.now().strftime(format)


_ENVIRONMENT = MnnEnvironment()
