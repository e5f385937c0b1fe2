"""Decoding a generation one id at a time without ever emitting a broken UTF-8 sequence."""

from __future__ import annotations

import codecs
from typing import Callable


class StreamDecoder:
    """feed(id) returns the text completed by that id's bytes; partial UTF-8 waits for the next id.
    Bytes that can never complete (an invalid sequence) come out as U+FFFD, as Python decodes them."""

    def __init__(self, token_bytes: Callable[[int], bytes]):
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        return self._decoder.decode(self._token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is still held, with an unfinished sequence as U+FFFD; the decoder starts afresh."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text
