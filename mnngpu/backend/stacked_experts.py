"""A SPARSE_MOE node's experts stacked in one buffer per layer for a device backend (OpenCL's and
Vulkan's ops/routing.py): whether they can be, and packing them once per node, on the first plan.

The packed layers are kept in the node's `weights` under the backend's type, so a node planned
again (another module of the pool) finds them; the experts' raw weights go once packed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from mnngpu.ops.routing import drop_raw_weights, raw_expert_weights, unstackable

if TYPE_CHECKING:
    from mnngpu.backend import Node

Packed = TypeVar("Packed")
# the device's rule on the experts' raw (gate_up, down) layers: why it cannot stack them, else None
DeviceRule = Callable[[list, list], "str | None"]


def decline_stacking(node: Node, backend_type: str, device_rule: DeviceRule) -> str | None:
    """Why `backend_type` cannot stack this node's experts: they differ (ops.routing.unstackable),
    else the device's own rule; None when it can, or has them packed already."""
    if backend_type in node.weights:
        return None
    experts = node.param.experts
    gate_ups, downs = raw_expert_weights(experts)
    return unstackable(gate_ups, downs, experts) or device_rule(gate_ups, downs)


def stacked_experts(node: Node, backend_type: str, pack: Callable[[list, list], Packed]) -> Packed:
    """The node's experts as `backend_type` stacks them: `pack(gate_ups, downs)` of their raw layers
    on the first call; the raw weights are dropped then (the CPU backup decodes them again from the
    file where it needs them)."""
    weights = node.weights
    if backend_type not in weights:
        experts = node.param.experts
        weights[backend_type] = pack(*raw_expert_weights(experts))
        drop_raw_weights(experts)
    return weights[backend_type]
