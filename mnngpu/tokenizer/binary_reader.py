"""Little-endian reads over the binary body of a .mtok file, with offsets in every error."""

from __future__ import annotations

import struct
from pathlib import Path

from mnngpu.errors import TokenizerError


class BinaryReader:
    def __init__(self, path: Path, data: bytes, offset: int):
        self.path = path
        self.data = data
        self.offset = offset
        self.section = "body"

    @property
    def remaining(self) -> int:
        return len(self.data) - self.offset

    def error(self, message: str, offset: int | None = None) -> TokenizerError:
        where = self.offset if offset is None else offset
        return TokenizerError(message, path=self.path, field=f"byte offset {where} ({self.section})")

    def _take(self, size: int, what: str) -> bytes:
        if self.remaining < size:
            raise self.error(f"the file ends early: expected {what} ({size} bytes), {self.remaining} left")
        chunk = self.data[self.offset:self.offset + size]
        self.offset += size
        return chunk

    def u8(self, what: str = "a u8") -> int:
        return self._take(1, what)[0]

    def u16(self, what: str = "a u16") -> int:
        return struct.unpack("<H", self._take(2, what))[0]

    def u32(self, what: str = "a u32") -> int:
        return struct.unpack("<I", self._take(4, what))[0]

    def f64(self, what: str = "an f64") -> float:
        return struct.unpack("<d", self._take(8, what))[0]

    def raw_str(self, what: str = "a string") -> bytes:
        return self._take(self.u16(f"the length of {what}"), what)

    def str(self, what: str = "a string") -> str:
        start = self.offset
        raw = self.raw_str(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.error(f"expected UTF-8 text for {what}", start) from None

    def count(self, what: str, item_size: int) -> int:
        """A u32 count of items at least item_size bytes each, checked against the bytes left."""
        start = self.offset
        value = self.u32(f"the count of {what}")
        if value * item_size > self.remaining:
            raise self.error(f"the count of {what} ({value}) needs more bytes than the file has", start)
        return value
