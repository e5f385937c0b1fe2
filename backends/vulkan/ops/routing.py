"""The MoE router's ops (Softmax, TopKV2, Reduction) and the EXPERT_ADD node on the device
(shaders/vulkan/routing.comp), so a MoE layer's routing stays in the recorded commands; and
SPARSE_MOE, which runs only the experts the router chose.

SPARSE_MOE packs its experts' gate, up and down layers stacked (ops/linear.py `pack_experts`,
once per node, the first time it is resized) and records two dispatches of linear_gemv -DEXPERT
whatever the row count: the gated GEMV over every (row, slot) entry, k per row, reading the
expert id the router wrote for that entry on the device, into a (rows * k, width) buffer; then
the down GEMV per row, summing its k slots times their routing weights. The commands are fixed
(k experts per row) and replay every step with no trip through the host; the expert weights read
per row are k experts' of num_experts.
"""

from __future__ import annotations

from mnngpu.backend.stacked_experts import decline_stacking, stacked_experts
from mnngpu.backends.vulkan.device import shared_device
from mnngpu.backends.vulkan.ops.base import VulkanExecution, element_groups
from mnngpu.backends.vulkan.ops.linear import (
    GROUP,
    GROUP_SIZE,
    QUAD,
    PackedLinear,
    _part_buffers,
    pack_experts,
    packable,
    stacked_bytes,
)
from mnngpu.backends.vulkan.program import pack_push
from mnngpu.ops import routing
from mnngpu.ops.routing import EXPERT_ADD, SPARSE_MOE


class VulkanRouting(VulkanExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        return routing.decline(inputs, outputs, node)

    def onResize(self, inputs, outputs):
        node = self.node
        outer, n, inner = routing.layout(inputs[0].shape, routing.axes_of(node, inputs))
        code = routing.REDUCE_CODES[node.param.operation] if node.type == "Reduction" else 0
        k = routing.top_k_count(inputs) if node.type == "TopKV2" else 0
        bindings = [inputs[0].device] + [self._output(t) for t in outputs]
        kernel = {"Softmax": "routing_softmax", "TopKV2": "routing_top_k", "Reduction": "routing_reduce"}[node.type]
        writes = tuple(range(1, len(bindings)))
        self.dispatch(kernel, bindings, pack_push("IIIII", outer, n, inner, code, k), element_groups(outer * inner),
                      writes)

    def _output(self, tensor):
        tensor.device = self.backend._new_tensor(tensor)
        return tensor.device


class VulkanExpertAdd(VulkanExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        return routing.decline(inputs, outputs, node)

    def onResize(self, inputs, outputs):
        y, weights, selected = inputs[:3]
        acc = inputs[3].device if len(inputs) > 3 else self.backend.placeholder
        out = outputs[0].device = self.backend._new_tensor(outputs[0])
        rows = y.shape[0]
        push = pack_push("IIIiI", rows, y.size // rows, self.node.param.top_k, self.node.param.expert,
                         int(len(inputs) > 3))
        self.dispatch("routing_expert_add", [y.device, weights.device, selected.device, acc, out], push,
                      element_groups(y.size))


class VulkanSparseMoE(VulkanExecution):
    """out[t] = sum over the k experts chosen for row t of w[t, j] * down(up * silu(gate))(x[t])."""

    @classmethod
    def decline(cls, inputs, outputs, node):
        return decline_stacking(node, "vulkan", _fits_device)

    def onResize(self, inputs, outputs):
        backend = self.backend
        gate, up, down = self._stacked()
        hidden, weights, selected = inputs
        rows, k = hidden.shape[0], self.node.param.top_k
        act = backend._scratch(rows * k * gate.oc * 4)
        out = outputs[0].device = backend._new_tensor(outputs[0])
        spare = backend.placeholder
        route = [selected.device, weights.device]
        self.dispatch(f"linear_gemv_{gate.kind}_expert_gated",
                      [hidden.device, *_part_buffers(gate.parts[0], spare), act, *_part_buffers(up.parts[0], spare),
                       *route], self._push(gate, rows * k), (_quad_groups(gate), rows * k, 1), writes=(5,))
        self.dispatch(f"linear_gemv_{down.kind}_expert", [act, *_part_buffers(down.parts[0], spare), out, *route],
                      self._push(down, rows), (_quad_groups(down), rows, 1), writes=(5,))

    def _push(self, layer: PackedLinear, entries: int) -> bytes:
        has_bias = int(layer.parts[0].bias is not None)
        return pack_push("10I", layer.oc, layer.ic, layer.block_size, layer.n_blocks, 0, layer.oc, has_bias, entries,
                         self.node.param.top_k, self.node.param.num_experts)

    def _stacked(self) -> tuple[PackedLinear, PackedLinear, PackedLinear]:
        """(gate, up, down) of every expert, packed stacked on the first resize."""
        return stacked_experts(self.node, "vulkan", self._pack)

    def _pack(self, gate_ups: list, downs: list) -> tuple[PackedLinear, PackedLinear, PackedLinear]:
        width = gate_ups[0].oc // 2
        halves = [(0, width), (width, 2 * width)]
        if not self.node.param.experts[0].gate_first:
            halves.reverse()
        gate, up = (pack_experts(self.backend, gate_ups, *half) for half in halves)
        return gate, up, pack_experts(self.backend, downs, 0, downs[0].oc)


def _fits_device(gate_ups: list, downs: list) -> str | None:
    if not (packable(gate_ups[0]) and packable(downs[0])):
        return f"the expert layers' input widths are not multiples of {GROUP}"
    largest = max(stacked_bytes(gate_ups, gate_ups[0].oc // 2, 4), stacked_bytes(downs, downs[0].oc, 4))
    if largest > shared_device().max_binding_bytes:
        return (f"its experts stacked take {largest} bytes, more than this device's maxStorageBufferRange "
                f"({shared_device().max_binding_bytes})")
    return None


def _quad_groups(layer: PackedLinear) -> int:
    return -(-layer.oc // (QUAD * GROUP_SIZE))


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"Softmax": VulkanRouting, "TopKV2": VulkanRouting, "Reduction": VulkanRouting,
              EXPERT_ADD: VulkanExpertAdd, SPARSE_MOE: VulkanSparseMoE}
