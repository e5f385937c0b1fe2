"""Structured output: a grammar that every token of a reply follows, run by llguidance.

    response_format {"type": "text"}                                  no grammar
                    {"type": "json_object"}                           any JSON object
                    {"type": "json_schema", "json_schema": {...}}     JSON valid against the schema
                    {"type": "grammar", "grammar": LARK}              text of a Lark grammar (extension)
                    {"type": "regex", "regex": PATTERN}               text matching a regex (extension)

    GrammarSpec           what a request asks for, as llguidance's grammar text
    response_format_spec  the spec of a chat request's response_format (None: plain text)
    vocabulary            llguidance's view of the model's tokenizer, built once
    Grammar               one request's matcher (a bad grammar is an InputError naming its field):
                          mask(logits) puts every token the grammar cannot take next at -inf,
                          advance(token) moves it on, finished: nothing more can follow

llguidance reads the vocabulary as the byte string of each id, so it is built from the ids
mnngpu's own tokenizer loaded (any of its formats, .mtok included), once per tokenizer. The
special tokens (the chat markup) are special to it too: no grammar text can be spelled with
them, and a Lark grammar names one as <|im_end|>. The reply's end tokens (the chat markup's stop
ids) end a reply only where the grammar is complete.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from mnngpu.errors import InputError

# JSON as json.dumps writes it: one space after ',' and ':', no other whitespace, so a model
# cannot spend its tokens on blanks
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
FORMAT_KEYS = {"text": (), "json_object": (), "json_schema": ("json_schema",), "grammar": ("grammar",),
               "regex": ("regex",)}
JSON_SCHEMA_KEYS = ("name", "schema", "strict", "description")


@dataclass(frozen=True)
class GrammarSpec:
    source: str   # llguidance's grammar text
    param: str    # the request field it came from, named by its errors

    def compile(self, tokenizer, end_ids) -> Grammar:
        """One request's Grammar over `tokenizer`'s ids; `end_ids` end the reply."""
        return Grammar(self, vocabulary(tokenizer, end_ids))


def json_schema_grammar(schema: dict, param: str) -> GrammarSpec:
    try:
        return GrammarSpec(_llguidance().LLMatcher.grammar_from_json_schema(schema, defaults=JSON_STYLE), param)
    except ValueError as exc:
        raise InputError(f"not a JSON schema llguidance reads: {exc}", field=param) from None


def json_schema_lark(schema: dict) -> str:
    """A Lark rule body that embeds `schema`, written in JSON_STYLE."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_STYLE})


def lark_grammar(lark: str, param: str) -> GrammarSpec:
    return GrammarSpec(_llguidance().LLMatcher.grammar_from_lark(lark), param)


def response_format_spec(value: Any) -> GrammarSpec | None:
    """The grammar a chat request's response_format asks for; None for plain text."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in FORMAT_KEYS:
        raise InputError(f"expected an object whose type is one of {list(FORMAT_KEYS)}", field="response_format")
    kind = value["type"]
    _only_keys(value, ("type", *FORMAT_KEYS[kind]), "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_schema_grammar({"type": "object"}, "response_format")
    if kind == "json_schema":
        return json_schema_grammar(_schema(value.get("json_schema")), "response_format.json_schema.schema")
    text = value.get(kind)
    if not isinstance(text, str) or not text:
        raise InputError(f"expected the {'Lark grammar' if kind == 'grammar' else 'regex'} as a non-empty string",
                         field=f"response_format.{kind}")
    llg = _llguidance()
    source = llg.LLMatcher.grammar_from_lark(text) if kind == "grammar" else llg.LLMatcher.grammar_from_regex(text)
    return GrammarSpec(source, f"response_format.{kind}")


def _schema(value: Any) -> dict:
    """OpenAI's json_schema object: a name, the schema, strict and a description. The schema is
    always enforced, so strict (OpenAI's promise to follow it) changes nothing here."""
    param = "response_format.json_schema"
    if not isinstance(value, dict):
        raise InputError("expected an object with 'name' and 'schema'", field=param)
    _only_keys(value, JSON_SCHEMA_KEYS, param)
    if not isinstance(value.get("name"), str):
        raise InputError("expected the schema's name as a string", field=f"{param}.name")
    if not isinstance(value.get("strict", False), bool):
        raise InputError("expected true or false", field=f"{param}.strict")
    schema = value.get("schema", {})
    if not isinstance(schema, dict):
        raise InputError("expected the JSON schema as an object", field=f"{param}.schema")
    return schema


def _only_keys(value: dict, known: tuple[str, ...], param: str) -> None:
    unknown = next((name for name in value if name not in known), None)
    if unknown is not None:
        raise InputError(f"unknown key '{unknown}' (expected {', '.join(known)})", field=f"{param}.{unknown}")


# ---- the vocabulary as llguidance reads it ---------------------------------------------------------


class _TokenBytes:
    """What llguidance's TokenizerWrapper reads from a tokenizer: each id's bytes, the special
    ids, an end id, and encoding of text (it tokenizes the literal text of a grammar with it)."""

    def __init__(self, tokenizer, end_ids: tuple[int, ...]):
        self.tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = sorted(set(tokenizer.special_ids) | set(end_ids))
        self.eos_token_id = end_ids[0]
        self.bos_token_id = None
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):   # llguidance asks once with bytes, to learn which it should pass
            raise TypeError("text only")
        return self._tokenizer.encode(text)[len(self._tokenizer.prefix_ids):]


@dataclass(frozen=True)
class Vocabulary:
    tokenizer: Any             # llguidance's LLTokenizer
    size: int                  # ids with text; logits beyond them are never allowed
    end_ids: tuple[int, ...]   # the ids that end a reply


_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocabulary(tokenizer, end_ids) -> Vocabulary:
    """llguidance's view of `tokenizer`, built once per tokenizer and set of end ids (about a
    second for a 150,000-token vocabulary)."""
    end = tuple(sorted(end_ids))
    if not end:
        raise InputError("the model's tokenizer names no stop token, so a grammar cannot end a reply",
                         field="response_format")
    built = _VOCABULARIES.setdefault(tokenizer, {})
    if end not in built:
        llg = _llguidance()
        try:
            wrapped = llg.TokenizerWrapper(_TokenBytes(tokenizer, end))
            built[end] = Vocabulary(llg.LLTokenizer(wrapped, eos_token=list(end)), tokenizer.vocab_size, end)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise InputError(f"llguidance cannot read this model's vocabulary: {exc}",
                             field="response_format") from None
    return built[end]


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise InputError("structured output needs the llguidance package (pip install llguidance)",
                         field="response_format") from None
    return llguidance


# ---- one request's grammar ----------------------------------------------------------------------------


class Grammar:
    """The grammar state of the reply being generated. reset() starts it again for the next choice."""

    def __init__(self, spec: GrammarSpec, vocab: Vocabulary):
        self.vocab, self.param = vocab, spec.param
        self.matcher = _llguidance().LLMatcher(vocab.tokenizer, spec.source, log_level=0)
        self._words = np.zeros((vocab.size + 31) // 32, dtype=np.int32)   # llguidance's bitmask
        self._allowed = np.zeros(vocab.size, dtype=bool)
        self._check()
        self._fill_mask()   # a grammar that allows no first token, or is too complex to start, fails here
        self._check()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise InputError(_first_line(self.matcher.get_error()), field=self.param)

    def __deepcopy__(self, memo: dict) -> Grammar:
        """Another sequence's grammar (a choice of its own): the matcher copied, the vocabulary shared."""
        copy = object.__new__(Grammar)
        copy.vocab, copy.param, copy.matcher = self.vocab, self.param, self.matcher.deep_copy()
        copy._words, copy._allowed = self._words.copy(), self._allowed.copy()
        return copy

    def reset(self) -> None:
        self.matcher.reset()

    @property
    def finished(self) -> bool:
        """Nothing can follow: the reply ends with an end token."""
        return self.matcher.is_stopped()

    @property
    def end_token(self) -> int:
        return self.vocab.end_ids[0]

    def _fill_mask(self) -> None:
        self.matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        self._allowed[:] = np.unpackbits(self._words.view(np.uint8), count=self.vocab.size, bitorder="little")

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of one row of logits with every token the grammar forbids next at -inf. A grammar
        that fails on the way (a limit of llguidance's reached) is an InputError naming its field."""
        self._fill_mask()
        self._check()
        row = np.asarray(logits, dtype=np.float32).reshape(-1)
        size = min(self.vocab.size, row.size)
        masked = np.full(row.shape, -np.inf, dtype=np.float32)
        np.copyto(masked[:size], row[:size], where=self._allowed[:size])
        return masked

    def allows(self, token: int) -> bool:
        """Whether the last mask allowed `token`."""
        return 0 <= token < self.vocab.size and bool(self._allowed[token])

    def advance(self, token: int) -> None:
        self.matcher.consume_token(token)
        self._check()


def _first_line(error: str) -> str:
    """llguidance's message without the parser state it appends."""
    line = error.strip().splitlines()[0] if error.strip() else "the grammar failed"
    return "the grammar allows no text at all (llguidance: NoExtensionBias)" if line == "NoExtensionBias" else line
