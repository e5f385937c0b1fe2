"""The JSON that goes back: a reply's body, and a stream's chunks, in OpenAI's shapes.

Chat choices carry `message` (or `delta`) and, when asked, `logprobs: {"content": [...]}`; when
the request offers tools, the calls a reply holds come back as `tool_calls` (and its finish_reason
is "tool_calls"), streamed as OpenAI streams them: a call's id and name first, then its arguments.
A thinking model's reasoning comes as `reasoning_content`, and as `reasoning` (vLLM's name), beside
`content` (null when the reply was cut off inside its think block), streamed as deltas of both;
completions choices carry `text` and the legacy `logprobs` object (text offsets counted from
the start of the choice's text, the echoed prompt included).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from mnngpu.apps.server.choice import Choice, Piece
from mnngpu.apps.server.logprobs import TokenLogprob, chat_logprobs, legacy_logprobs
from mnngpu.apps.server.protocol import Usage
from mnngpu.apps.server.tool_calls import Deltas, ToolCallParser, ToolRequest


class ResponseShape:
    """The ids, object names and choice layout of one endpoint's replies and stream chunks."""

    def __init__(self, chat: bool, model: str, tokenizer, logprobs: bool = False, tools: ToolRequest | None = None):
        self.chat = chat
        self.tools = tools if tools is not None and tools.in_prompt is not None else None
        self._parsers: dict[int, ToolCallParser] = {}   # a stream's, per choice
        self.model = model
        self.tokenizer = tokenizer
        self.logprobs = logprobs   # whether the request asked for them (a choice then always has the object)
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion.chunk" if chat else "text_completion"

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def _logprobs(self, entries: list[TokenLogprob] | None) -> dict | None:
        if not self.logprobs or entries is None:
            return None
        return chat_logprobs(entries, self.tokenizer) if self.chat else legacy_logprobs(entries, self.tokenizer)

    def complete(self, choices: list[Choice], usage: Usage) -> dict:
        bodies = []
        for choice in choices:
            if self.chat:
                message, finish = self._message(choice)
                body = {"index": choice.index, "message": message, "logprobs": self._logprobs(choice.logprobs),
                        "finish_reason": finish}
            else:
                body = {"index": choice.index, "text": choice.text, "logprobs": self._logprobs(choice.logprobs),
                        "finish_reason": choice.finish_reason}
            bodies.append(body)
        body = self._envelope("chat.completion" if self.chat else "text_completion", bodies)
        body["usage"] = usage.body()
        return body

    def _message(self, choice: Choice) -> tuple[dict, str]:
        message, finish = self._answer(choice)
        if choice.reasoning is not None:
            message.update(reasoning_content=choice.reasoning, reasoning=choice.reasoning)
            if not choice.answered:
                message["content"] = None
        return message, finish

    def _answer(self, choice: Choice) -> tuple[dict, str]:
        if self.tools is None:
            return {"role": "assistant", "content": choice.text}, choice.finish_reason
        parser = self._new_parser()
        deltas = parser.feed(choice.text)
        deltas.extend(parser.finish())
        message: dict[str, Any] = {"role": "assistant", "content": deltas.content if deltas.content or not
                                   deltas.calls else None}
        if deltas.calls:
            message["tool_calls"] = deltas.tool_calls()
        return message, _finish_reason(choice.finish_reason, parser)

    def _new_parser(self) -> ToolCallParser:
        return ToolCallParser(self.tools.names, self.tools.parallel)

    def first_chunk(self, index: int) -> dict:
        """A choice's opening event (chat: its role)."""
        return self.chunk(Piece(index), first=True)

    def chunk(self, piece: Piece, first: bool = False) -> dict | None:
        """The event for one piece; None when a tool call holds back all it has (nothing to send yet)."""
        logprobs = self._logprobs(piece.logprobs) if piece.logprobs or piece.text and self.logprobs else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            finish = piece.finish_reason
            if piece.reasoning:
                delta.update(reasoning_content=piece.reasoning, reasoning=piece.reasoning)
            if self.tools is None:
                if piece.text or piece.logprobs and not piece.reasoning:
                    delta["content"] = piece.text
            elif not first:
                if piece.index not in self._parsers:
                    self._parsers[piece.index] = self._new_parser()
                parser = self._parsers[piece.index]
                deltas = parser.feed(piece.text)
                if finish:
                    deltas.extend(parser.finish())
                    finish = _finish_reason(finish, parser)
                _add_deltas(delta, deltas, bool(piece.logprobs))
                if not delta and not finish:
                    return None
            choice = {"index": piece.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": piece.index, "text": piece.text, "logprobs": logprobs,
                      "finish_reason": piece.finish_reason}
        return self._envelope(self.object, [choice])

    def usage_chunk(self, usage: Usage) -> dict:
        body = self._envelope(self.object, [])
        body["usage"] = usage.body()
        return body


def _finish_reason(finish: str, parser: ToolCallParser) -> str:
    return "tool_calls" if finish == "stop" and parser.calls else finish


def _add_deltas(delta: dict, deltas: Deltas, has_logprobs: bool) -> None:
    if deltas.content or has_logprobs:
        delta["content"] = deltas.content
    if deltas.calls:
        delta["tool_calls"] = deltas.tool_calls()
