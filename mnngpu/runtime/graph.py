"""The graph as the runtime walks it: ops over global tensor ids, and errors that name the op.

Shared by fusion (rewrites the op list), placement (decides where each op runs) and the
Pipeline (runs it), so none of them imports another for these.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from mnngpu.backend import Node
from mnngpu.errors import ModelFormatError

# What numpy/numba raise when a damaged graph's values (a reshape target, an axis, a slice
# bound) do not fit the tensors: reported as a format error naming the op.
NUMERIC_ERRORS = (ArithmeticError, ValueError, IndexError, TypeError)


@dataclass
class GraphOp:
    node: Node
    inputs: list[int]
    outputs: list[int]


def named_error(node: Node, what: str, exc: Exception) -> ModelFormatError:
    return ModelFormatError(f"op {node.type} {what}: {exc}", field=node.name)


@contextmanager
def op_errors_named(node: Node, what: str):
    try:
        yield
    except NUMERIC_ERRORS as exc:
        raise named_error(node, what, exc) from exc
