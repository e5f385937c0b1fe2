"""Declaring FlatBuffers tables as dataclasses, and decoding them.

A parameter table is written once, as a dataclass whose fields are listed in the
schema's order, each with its FlatBuffers kind:

    @flat_table
    class BinaryOp:
        opType: str = fb(Enum(enums.BINARY_OP), "ADD")
        T: str = fb(Enum(enums.DATA_TYPE), "DT_FLOAT")
        activationType: int = fb(I32, 0)

The field's position is its schema index, so its vtable slot is 4 + 2*position; a
field the engine never needs still has to be declared (as `Skip()` if its type is
not modelled) to keep the positions right. Unions are not declared here: `Op.main`
is the only one and net.py reads it by hand.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from flatbuffers import number_types as N

from .enums import enum_name
from .flatbuf import TableView

FB_KIND = "flatbuffers_kind"


@dataclass(frozen=True)
class Scalar:
    flags: Any  # a flatbuffers.number_types *Flags class


BOOL = Scalar(N.BoolFlags)
I8 = Scalar(N.Int8Flags)
U8 = Scalar(N.Uint8Flags)
I32 = Scalar(N.Int32Flags)
U32 = Scalar(N.Uint32Flags)
I64 = Scalar(N.Int64Flags)
F32 = Scalar(N.Float32Flags)


@dataclass(frozen=True)
class Enum:
    """An enum field, decoded to its NAME. MNN's enums are int (4 bytes) or byte (1)."""

    names: dict[int, str]
    flags: Any = N.Int32Flags


def ByteEnum(names: dict[int, str]) -> Enum:
    return Enum(names, N.Int8Flags)


@dataclass(frozen=True)
class String:
    pass


@dataclass(frozen=True)
class Array:
    """A vector of scalars, kept as a read-only numpy view (bulk data: weights, tables)."""

    dtype: str


@dataclass(frozen=True)
class IntList:
    """A short vector of integers (shapes, axes, external offsets), decoded to list[int]."""

    dtype: str = "<i4"


@dataclass(frozen=True)
class EnumList:
    names: dict[int, str]
    dtype: str = "<i4"


@dataclass(frozen=True)
class StringList:
    pass


@dataclass(frozen=True)
class Sub:
    """A nested table; `cls` may be a class name, resolved when first decoded."""

    cls: Any


@dataclass(frozen=True)
class SubList:
    cls: Any


@dataclass(frozen=True)
class Skip:
    """A field whose type is not modelled: it keeps its slot and decodes to None."""


_REGISTRY: dict[str, type] = {}


def fb(kind, default=None):
    """A dataclass field of FlatBuffers kind `kind` with the schema's default."""
    return dataclasses.field(default=default, metadata={FB_KIND: kind})


def flat_table(cls):
    """Make `cls` a dataclass whose fields are read from a FlatBuffers table in order."""
    cls = dataclass(cls)
    cls.__flat_fields__ = tuple((f.name, f.metadata[FB_KIND], f.default) for f in dataclasses.fields(cls))
    _REGISTRY[cls.__name__] = cls
    return cls


def decode_table(view: TableView, cls: type):
    """Build a `cls` instance from a verified table."""
    values = {}
    for index, (name, kind, default) in enumerate(cls.__flat_fields__):
        values[name] = _decode_field(view, index, name, kind, default)
    return cls(**values)


def _resolve(cls) -> type:
    return _REGISTRY[cls] if isinstance(cls, str) else cls


def _decode_field(view: TableView, index: int, name: str, kind, default):
    match kind:
        case Scalar(flags):
            return view.scalar(index, flags, default, name)
        case Enum(names, flags):
            if not view.has(index):
                return default
            return enum_name(names, view.scalar(index, flags, 0, name))
        case String():
            return view.string(index, name)
        case Array(dtype):
            return view.array(index, dtype, name)
        case IntList(dtype):
            values = view.array(index, dtype, name)
            return None if values is None else values.tolist()
        case EnumList(names, dtype):
            values = view.array(index, dtype, name)
            return None if values is None else [enum_name(names, v) for v in values.tolist()]
        case StringList():
            return view.strings(index, name)
        case Sub(cls):
            sub = view.table(index, name)
            return None if sub is None else decode_table(sub, _resolve(cls))
        case SubList(cls):
            subs = view.tables(index, name)
            return None if subs is None else [decode_table(sub, _resolve(cls)) for sub in subs]
        case Skip():
            return None
    raise TypeError(f"unknown FlatBuffers field kind {kind!r} for {name}")
