"""The MoE router's ops as device kernels see them: Softmax, TopKV2 and Reduction over one
contiguous run of axes, and the engine's EXPERT_ADD node (runtime/moe.py).

Each kernel views its input as (outer, n, inner), n the extent it works along; `layout` gives
that view and `decline` the cases a device kernel does not take (they run on the CPU backup,
said by placement), written once for every device backend.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend import Node, Tensor
from mnngpu.runtime import host_ops
from mnngpu.runtime.op_table import EXPERT_ADD

ROUTING_OPS = ("Softmax", "TopKV2", "Reduction", EXPERT_ADD)
# Reduction operations the kernels run, and the code they take (shaders: reduction)
REDUCE_CODES = {"SUM": 0, "MEAN": 1, "MAXIMUM": 2, "MINIMUM": 3, "PROD": 4}


def layout(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(outer, n, inner) of `shape` around the contiguous `axes`; None when they are not contiguous."""
    if not axes or list(axes) != list(range(axes[0], axes[-1] + 1)):
        return None
    first, last = axes[0], axes[-1] + 1
    return _size(shape[:first]), _size(shape[first:last]), _size(shape[last:])


def _size(dims) -> int:
    return int(np.prod(dims, dtype=np.int64))


def axes_of(node: Node, inputs: list[Tensor]) -> tuple[int, ...]:
    """The axes the op works along (its inputs beyond the first are host values by now)."""
    rank = len(inputs[0].shape)
    values = [None, *(t.host for t in inputs[1:])]
    if node.type == "Softmax":
        return ((int(node.param.axis) if node.param is not None else -1) % rank,)
    if node.type == "TopKV2":
        return (host_ops.top_k_axis(values, rank)[1],)
    return host_ops.reduction_axes(node, values, rank)


def _float(tensor: Tensor) -> bool:
    return np.dtype(tensor.dtype) == np.float32


def decline(node: Node, inputs: list[Tensor]) -> str | None:
    """Why a device kernel cannot run this routing op; None when it can."""
    if node.type == EXPERT_ADD:
        y, weights, selected = inputs[:3]
        if not (_float(y) and _float(weights)) or np.dtype(selected.dtype) != np.int32:
            return "ExpertAdd kernels take float expert outputs and weights and int32 expert ids"
        return None
    if not _float(inputs[0]):
        return f"{node.type} kernels run on float32 tensors, got {inputs[0].dtype}"
    if any(t.host is None for t in inputs[1:]):
        return "k or axes computed on the device"
    if node.type == "TopKV2" and node.param is not None and not node.param.largest:
        return "TopKV2 kernels select the largest values"
    if node.type == "Reduction" and node.param.operation not in REDUCE_CODES:
        return f"no Reduction kernel for {node.param.operation}"
    if layout(inputs[0].shape, axes_of(node, inputs)) is None:
        return "the reduced axes are not contiguous"
    return None


def top_k_count(inputs: list[Tensor]) -> int:
    return host_ops.top_k_axis([None, inputs[1].host], len(inputs[0].shape))[0]
