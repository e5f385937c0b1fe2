"""Bounds-checked access to a FlatBuffers buffer, the way a FlatBuffers verifier checks it.

Reads go through the `flatbuffers` runtime's `Table`; every offset, vtable, string and
vector is first checked to lie inside the buffer, so a damaged file raises
ModelFormatError (naming the field path and byte offset) instead of IndexError,
struct.error or a silently wrong value.

Layout reminders: a table starts with an int32 `soffset` to its vtable (vtable =
table - soffset); the vtable is `u16 vtable_size, u16 table_size, u16 field_offset...`;
field i lives in vtable slot 4 + 2*i (0 means "absent, use the default"). Strings,
vectors and sub-tables are stored as a u32 offset relative to the field's own position;
a vector is `u32 length` followed by its elements, a string is a byte vector plus a NUL.
"""

from __future__ import annotations

import os
import struct

import numpy as np
from flatbuffers import number_types as N
from flatbuffers.table import Table

from ..errors import ModelFormatError

MAX_DEPTH = 64  # the FlatBuffers C++ verifier's default nesting limit

_U32 = struct.Struct("<I")


class FlatBuffer:
    """A whole .mnn file in memory, plus the file name used in error messages."""

    def __init__(self, data: bytes, path: str | os.PathLike):
        self.data = data
        self.size = len(data)
        self.path = os.fspath(path)
        # Every distinct table takes at least 4 bytes, so a buffer that makes the reader visit
        # more tables than that shares them (a DAG, or a cycle under the depth limit) and could
        # make decoding explode; the C++ verifier caps the table count for the same reason.
        self._tables_left = max(1024, self.size // 4)

    def error(self, expected: str, where: str, pos: int | None = None) -> ModelFormatError:
        at = f" (at offset 0x{pos:x})" if pos is not None else ""
        return ModelFormatError(f"expected {expected}{at}", path=self.path, field=where)

    def need(self, pos: int, length: int, where: str) -> None:
        if pos < 0 or length < 0 or pos + length > self.size:
            raise self.error(f"{length} bytes inside the {self.size}-byte buffer", where, pos)

    def u32(self, pos: int, where: str) -> int:
        self.need(pos, 4, where)
        return _U32.unpack_from(self.data, pos)[0]

    def follow(self, pos: int, where: str) -> int:
        """The absolute position a u32 offset stored at `pos` points to."""
        rel = self.u32(pos, where)
        if rel == 0 or rel >= 2**31:
            raise self.error("a non-zero forward offset", where, pos)
        target = pos + rel
        self.need(target, 1, where)
        return target

    def root(self, where: str = "root") -> TableView:
        return self.table_at(self.follow(0, where), where, depth=0)

    def table_at(self, pos: int, where: str, depth: int) -> TableView:
        if depth > MAX_DEPTH:
            raise self.error(f"tables nested at most {MAX_DEPTH} deep", where, pos)
        self._tables_left -= 1
        if self._tables_left < 0:
            raise self.error(f"at most {max(1024, self.size // 4)} table visits for a {self.size}-byte buffer "
                             "(tables are shared or cyclic)", where, pos)
        self.need(pos, 4, where)
        vtable = pos - struct.unpack_from("<i", self.data, pos)[0]
        self.need(vtable, 4, where + " (vtable)")
        vtable_size, table_size = struct.unpack_from("<HH", self.data, vtable)
        if vtable_size < 4 or vtable_size % 2:
            raise self.error("a vtable size that is even and at least 4", where, vtable)
        self.need(vtable, vtable_size, where + " (vtable)")
        if table_size < 4:
            raise self.error("a table size of at least 4", where, vtable)
        self.need(pos, table_size, where)
        return TableView(self, pos, vtable, vtable_size, table_size, where, depth)


class TableView:
    """One verified table: typed, checked getters by field index (schema order, from 0)."""

    def __init__(self, fb: FlatBuffer, pos: int, vtable: int, vtable_size: int, table_size: int, where: str,
                 depth: int):
        self.fb = fb
        self.pos = pos
        self.where = where
        self.depth = depth
        self._table_size = table_size
        self._table = Table(fb.data, pos)
        # the field offsets, read once (the vtable was checked to lie in the buffer)
        self._field_offsets = struct.unpack_from(f"<{vtable_size // 2 - 2}H", fb.data, vtable + 4)

    def _path(self, name: str) -> str:
        return f"{self.where}.{name}"

    def _field_pos(self, index: int, width: int, name: str) -> int | None:
        if index >= len(self._field_offsets):
            return None
        rel = self._field_offsets[index]  # the value in vtable slot 4 + 2*index
        if rel == 0:
            return None
        if rel + width > self._table_size:
            raise self.fb.error(f"field to lie inside its {self._table_size}-byte table",
                                self._path(name), self.pos + rel)
        return self.pos + rel

    def has(self, index: int) -> bool:
        return self._field_pos(index, 0, f"#{index}") is not None

    def scalar(self, index: int, flags, default, name: str):
        pos = self._field_pos(index, flags.bytewidth, name)
        if pos is None:
            return default
        return self._table.Get(flags, pos)

    def _target(self, index: int, name: str) -> int | None:
        pos = self._field_pos(index, 4, name)
        if pos is None:
            return None
        return self.fb.follow(pos, self._path(name))

    def _vector_at(self, start: int, itemsize: int, where: str) -> tuple[int, int]:
        count = self.fb.u32(start, where)
        self.fb.need(start + 4, count * itemsize, where)
        return start + 4, count

    def string(self, index: int, name: str) -> str | None:
        pos = self._field_pos(index, 4, name)
        return None if pos is None else self._string_at(pos, self._path(name))

    def _string_at(self, offset_pos: int, where: str) -> str:
        """The string whose u32 offset is stored at `offset_pos`."""
        data_pos, length = self._vector_at(self.fb.follow(offset_pos, where), 1, where)
        self.fb.need(data_pos + length, 1, where)
        if self.fb.data[data_pos + length] != 0:
            raise self.fb.error("a NUL byte after the string", where, data_pos + length)
        try:
            return self._table.String(offset_pos).decode("utf-8")
        except UnicodeDecodeError as err:
            raise self.fb.error(f"UTF-8 text ({err.reason})", where, data_pos) from None

    def array(self, index: int, dtype: str, name: str) -> np.ndarray | None:
        """A vector of scalars as a read-only numpy view (little-endian `dtype`)."""
        start = self._target(index, name)
        if start is None:
            return None
        itemsize = np.dtype(dtype).itemsize
        data_pos, count = self._vector_at(start, itemsize, self._path(name))
        return np.frombuffer(self.fb.data, dtype=dtype, count=count, offset=data_pos)

    def strings(self, index: int, name: str) -> list[str] | None:
        slots = self._offset_slots(index, name)
        if slots is None:
            return None
        return [self._string_at(slot, f"{self._path(name)}[{i}]") for i, slot in enumerate(slots)]

    def table(self, index: int, name: str) -> TableView | None:
        start = self._target(index, name)
        if start is None:
            return None
        return self.fb.table_at(start, self._path(name), self.depth + 1)

    def tables(self, index: int, name: str) -> list[TableView] | None:
        slots = self._offset_slots(index, name)
        if slots is None:
            return None
        views = []
        for i, slot in enumerate(slots):
            where = f"{self._path(name)}[{i}]"
            views.append(self.fb.table_at(self.fb.follow(slot, where), where, self.depth + 1))
        return views

    def _offset_slots(self, index: int, name: str) -> range | None:
        """Positions of the u32 offsets in a vector of strings or tables."""
        start = self._target(index, name)
        if start is None:
            return None
        data_pos, count = self._vector_at(start, 4, self._path(name))
        return range(data_pos, data_pos + 4 * count, 4)

    def union(self, type_index: int, value_index: int, name: str) -> tuple[int, TableView | None]:
        """(type code, table) of a union field, which takes two slots: `<name>_type`, then the value."""
        code = self.scalar(type_index, N.Uint8Flags, 0, name + "_type")
        if code == 0:
            return 0, None
        return code, self.table(value_index, name)
