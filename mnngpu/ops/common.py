"""What every op family file shares: the row type of the op table, the dtypes, and the two
generic shape rules (the input's own shape; a host rule run on a zero-cost stand-in).

A family file (mnngpu/ops/<family>.py) lists its op types in `ROWS`, one OpType each;
mnngpu/ops/op_table.py merges them into the table the runtime reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mnngpu.errors import ModelFormatError

if TYPE_CHECKING:
    from mnngpu.backend import Node, Tensor
    from mnngpu.format.weights import WeightFile

FLOAT = np.float32
INT = np.int32
DTYPES = {"DT_FLOAT": FLOAT, "DT_INT32": INT, "DT_INT64": INT, "DT_BOOL": INT, "DT_HALF": FLOAT,
          "DT_BFLOAT16": FLOAT, "DT_DOUBLE": FLOAT, "DT_UINT8": INT, "DT_INT8": INT}

# Fused node types carry FUSED_PREFIX: no MNN op type contains a dot, so a graph can never name one.
FUSED_PREFIX = "fused."

# when validate insists on the parameter table: always, or only when the op has no second input
# to read its values from (a Reshape's target shape, an Unsqueeze's axes)
ALWAYS, WITHOUT_SECOND_INPUT = "always", "without a second input"

Shape = tuple[int, ...]
ShapeRule = Callable[["Node", list["Tensor"]], list[tuple[Shape, np.dtype]]]
HostRule = Callable[["Node", list[np.ndarray]], Any]
WeightRule = Callable[["WeightFile | None", Any, str], dict[str, Any]]


@dataclass(frozen=True)
class OpType:
    shape: ShapeRule
    host: HostRule | None = None   # numpy semantics: folded at resize when every input is known on the host
                                   # (a tuple of arrays for an op with several outputs)
    shape_only: bool = False       # reads only its input's shape: always folded
    param: str | None = None       # the OpParameter table MNN pairs with this op type
    param_required: str | None = None
    min_inputs: int = 1
    weights: WeightRule | None = None  # decodes the op's weights (weight file, param, op name) at load
    fuses: str = ""                # an engine-made node: the exported pattern it replaces
    runs_as: str = ""              # an op the loader rewrites into other nodes: the node type that runs it


def host_values(node: Node, inputs: list[Tensor], first: int) -> list[np.ndarray]:
    """The host values of inputs[first:], which a shape rule needs known before the op runs."""
    values = []
    for i, tensor in enumerate(inputs[first:], start=first):
        if tensor.host is None:
            raise ModelFormatError(f"input {i} ('{tensor.name}') must be known before the op runs "
                                   "(a shape or index input computed from activations)", field=node.name)
        values.append(tensor.host)
    return values


def shape_stand_in(tensor: Tensor) -> np.ndarray:
    """A zero-cost array with a tensor's shape, for ops whose result depends only on shapes."""
    return np.broadcast_to(np.zeros((), dtype=tensor.dtype), tensor.shape)


def rewritten_at_load(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """The shape rule of an op the loader rewrites into other nodes (OpType.runs_as): never a node itself."""
    raise ModelFormatError(f"{node.type} is rewritten at load into the nodes that run it "
                           "(mnngpu/runtime/c4_ops.py); it does not run as itself", field=node.name)


def same(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
    """The input's shape and dtype (ConvertTensor, Identity, LayerNorm, UnaryOp, ...)."""
    return [(inputs[0].shape, inputs[0].dtype)]


def evaluated(host: HostRule) -> ShapeRule:
    """The shape rule of an op whose host rule is cheap on a stand-in: run it on a zero-cost array
    of input 0's shape and the host values of the other inputs (one result per output)."""
    def rule(node: Node, inputs: list[Tensor]) -> list[tuple[Shape, np.dtype]]:
        result = host(node, [shape_stand_in(inputs[0]), *host_values(node, inputs, 1)])
        return [(part.shape, part.dtype) for part in (result if isinstance(result, tuple) else (result,))]
    return rule
