"""The JSON that goes back: a reply's body, and a stream's chunks, in OpenAI's shapes.

Chat choices carry `message` (or `delta`) and, when asked, `logprobs: {"content": [...]}`;
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


class ResponseShape:
    """The ids, object names and choice layout of one endpoint's replies and stream chunks."""

    def __init__(self, chat: bool, model: str, tokenizer, logprobs: bool = False):
        self.chat = chat
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
                body = {"index": choice.index, "message": {"role": "assistant", "content": choice.text},
                        "logprobs": self._logprobs(choice.logprobs), "finish_reason": choice.finish_reason}
            else:
                body = {"index": choice.index, "text": choice.text, "logprobs": self._logprobs(choice.logprobs),
                        "finish_reason": choice.finish_reason}
            bodies.append(body)
        body = self._envelope("chat.completion" if self.chat else "text_completion", bodies)
        body["usage"] = usage.body()
        return body

    def first_chunk(self, index: int) -> dict:
        """A choice's opening event (chat: its role)."""
        return self.chunk(Piece(index), first=True)

    def chunk(self, piece: Piece, first: bool = False) -> dict:
        logprobs = self._logprobs(piece.logprobs) if piece.logprobs or piece.text and self.logprobs else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if piece.text or piece.logprobs:
                delta["content"] = piece.text
            choice = {"index": piece.index, "delta": delta, "logprobs": logprobs, "finish_reason": piece.finish_reason}
        else:
            choice = {"index": piece.index, "text": piece.text, "logprobs": logprobs,
                      "finish_reason": piece.finish_reason}
        return self._envelope(self.object, [choice])

    def usage_chunk(self, usage: Usage) -> dict:
        body = self._envelope(self.object, [])
        body["usage"] = usage.body()
        return body
