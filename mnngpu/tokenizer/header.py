"""The three text lines every MNN tokenizer file starts with, and line-numbered access to a text body.

    430 <type>
    <n_special> <n_stop> <n_prefix>
    <the special ids> <the stop ids> <the prefix ids>
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mnngpu.errors import TokenizerError

MAGIC_NUMBER = 430
SENTENCEPIECE, TIKTOKEN, BERT, HUGGINGFACE, MTOK = range(5)


@dataclass(frozen=True)
class TokenizerHeader:
    type: int
    special_ids: list[int]
    stop_ids: list[int]
    prefix_ids: list[int]


class TextBody:
    """The lines after the header, numbered as in the file (1-based) for error messages."""

    def __init__(self, path: Path, lines: list[str], first_line_number: int):
        self.path = path
        self._lines = lines
        self._next = 0
        self._first = first_line_number

    @property
    def line_number(self) -> int:
        """The file line number of the line `next_line()` returns next."""
        return self._first + self._next

    def next_line(self, what: str) -> str:
        if self._next >= len(self._lines):
            raise self.error(f"the file ends early: expected {what}")
        line = self._lines[self._next]
        self._next += 1
        return line

    def next_int(self, what: str) -> int:
        line = self.next_line(what)
        try:
            return int(line.split()[0])
        except (ValueError, IndexError):
            raise self.error(f"expected {what} (an integer), found {line[:40]!r}", self.line_number - 1) from None

    def error(self, message: str, line_number: int | None = None) -> TokenizerError:
        return TokenizerError(message, path=self.path, field=f"line {line_number or self.line_number}")


def _split_lines(data: bytes, count: int) -> tuple[list[bytes], int]:
    """The first `count` lines (without newline) and the byte offset just after them."""
    lines, offset = [], 0
    for _ in range(count):
        end = data.find(b"\n", offset)
        if end < 0:
            end = len(data)
        lines.append(data[offset:end].rstrip(b"\r"))
        offset = min(end + 1, len(data))
    return lines, offset


def _ints(line: bytes, path: Path, line_number: int, what: str) -> list[int]:
    try:
        return [int(x) for x in line.split()]
    except ValueError:
        raise TokenizerError(f"expected {what} (integers), found {line[:60]!r}", path=path,
                             field=f"line {line_number}") from None


def read_header(path: Path, data: bytes) -> tuple[TokenizerHeader, int]:
    """Parse the header; returns it and the byte offset where the body starts."""
    (magic_line, counts_line, ids_line), body_offset = _split_lines(data, 3)
    magic = _ints(magic_line, path, 1, f"'{MAGIC_NUMBER} <type>'")
    if len(magic) < 2 or magic[0] != MAGIC_NUMBER:
        raise TokenizerError(f"expected '{MAGIC_NUMBER} <type>' (an MNN tokenizer file), found "
                             f"{magic_line[:40]!r}", path=path, field="line 1")
    counts = _ints(counts_line, path, 2, "'<n_special> <n_stop> <n_prefix>'")
    if len(counts) != 3 or min(counts) < 0:
        raise TokenizerError(f"expected three counts '<n_special> <n_stop> <n_prefix>', found "
                             f"{counts_line[:40]!r}", path=path, field="line 2")
    ids = _ints(ids_line, path, 3, "the special, stop and prefix ids")
    n_special, n_stop, n_prefix = counts
    if len(ids) < sum(counts):
        raise TokenizerError(f"expected {sum(counts)} ids (line 2 counts {counts}), found {len(ids)}",
                             path=path, field="line 3")
    header = TokenizerHeader(type=magic[1], special_ids=ids[:n_special],
                             stop_ids=ids[n_special:n_special + n_stop],
                             prefix_ids=ids[n_special + n_stop:n_special + n_stop + n_prefix])
    return header, body_offset


def text_body(path: Path, data: bytes, body_offset: int) -> TextBody:
    try:
        text = data[body_offset:].decode("utf-8")
    except UnicodeDecodeError as error:
        line = 4 + data[body_offset:body_offset + error.start].count(b"\n")
        raise TokenizerError("expected UTF-8 text", path=path, field=f"line {line}") from None
    return TextBody(path, text.split("\n"), first_line_number=4)
