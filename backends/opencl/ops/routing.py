"""The MoE router's ops (Softmax, TopKV2, Reduction) and the EXPERT_ADD node on the device
(shaders/opencl/routing.cl), so a MoE layer's routing never leaves the device; and SPARSE_MOE,
which runs only the experts the router chose.

SPARSE_MOE packs its experts' gate_up and down layers stacked (ops/linear.py `pack_experts`,
once per node, the first time it is planned) and enqueues two kernels of linear.cl whatever the
row count: expert_gated_gemv over every (row, slot) entry, k per row, reading the expert id the
router wrote on the device, into a (rows * k, width) buffer; then expert_down_gemv per row,
summing its k slots times their routing weights. Both are linear_rows_gemv's dot product
(rows_gemv4) on the chosen expert's rows, so the expert weights read per row are k experts' of
num_experts, and a step replays the same kernels with no trip through the host.
"""

from __future__ import annotations

import numpy as np

from mnngpu.backend.stacked_experts import decline_stacking, stacked_experts
from mnngpu.backends.opencl.ops.base import OpenCLExecution
from mnngpu.backends.opencl.ops.linear import CPU_GROUP, ROWS, DeviceLinear, pack_experts
from mnngpu.errors import BackendUnavailableError
from mnngpu.ops import routing
from mnngpu.ops.routing import EXPERT_ADD, SPARSE_MOE


def _lines(node, inputs) -> tuple[int, int, int]:
    return routing.layout(inputs[0].shape, routing.axes_of(node, inputs))


class OpenCLRouting(OpenCLExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        return routing.decline(inputs, outputs, node)


class OpenCLSoftmax(OpenCLRouting):
    def plan(self, inputs, outputs):
        outer, n, inner = _lines(self.node, inputs)
        args = [outputs[0], inputs[0], np.int32(outer), np.int32(n), np.int32(inner)]
        self.prepare("routing.cl", "softmax_lines", args, (outer * inner,))


class OpenCLTopK(OpenCLRouting):
    def plan(self, inputs, outputs):
        outer, n, inner = _lines(self.node, inputs)
        k = routing.top_k_count(inputs)
        args = [outputs[0], outputs[1], inputs[0], np.int32(outer), np.int32(n), np.int32(inner), np.int32(k)]
        self.prepare("routing.cl", "top_k_lines", args, (outer * inner,))


class OpenCLReduction(OpenCLRouting):
    def plan(self, inputs, outputs):
        outer, n, inner = _lines(self.node, inputs)
        op = routing.REDUCE_CODES[self.node.param.operation]
        args = [outputs[0], inputs[0], np.int32(outer), np.int32(n), np.int32(inner), np.int32(op)]
        self.prepare("routing.cl", "reduce_lines", args, (outer * inner,))


class OpenCLExpertAdd(OpenCLRouting):
    def plan(self, inputs, outputs):
        y, weights, selected = inputs[:3]
        acc = inputs[3] if len(inputs) > 3 else self.backend.placeholder
        rows = y.shape[0]
        args = [outputs[0], y, weights, selected, acc, np.int32(rows), np.int32(y.size // rows),
                np.int32(self.node.param.top_k), np.int32(self.node.param.expert), np.int32(len(inputs) > 3)]
        self.prepare("routing.cl", "expert_add", args, (y.size,))


class OpenCLSparseMoE(OpenCLExecution):
    """out[t] = sum over the k experts chosen for row t of w[t, j] * down(up * silu(gate))(x[t])."""

    @classmethod
    def decline(cls, inputs, outputs, node):
        reason = decline_stacking(node, "opencl", _kernel_widths)
        if reason is not None:
            # The CPU backup's sparse MoE between OpenCL ops gives wrong decode tokens (a known defect,
            # docs/formats.md): refuse rather than answer wrongly.
            raise BackendUnavailableError(f"{node.name}: sparse experts on OpenCL: {reason}; this MoE layer "
                                          "runs on backend_type cpu or vulkan", field="backend_type")

    def plan(self, inputs, outputs):
        gate_up, down = self._stacked()
        hidden, weights, selected = inputs
        rows, k, n_experts = hidden.shape[0], self.node.param.top_k, self.node.param.num_experts
        width = down.ic
        act = self.backend._scratch(rows * k * width)
        gate_first = int(self.node.param.experts[0].gate_first)
        self.prepare("linear.cl", "expert_gated_gemv",
                     [act, hidden, *self._layer(gate_up, selected, k, n_experts, width), np.int32(gate_first)],
                     (-(-width // ROWS), rows * k), (CPU_GROUP, 1), {f"WEIGHT_{gate_up.layout}": 1})
        self.prepare("linear.cl", "expert_down_gemv", [outputs[0], act, weights,
                                                       *self._layer(down, selected, k, n_experts, down.oc // n_experts)],
                     (-(-down.oc // n_experts // ROWS), rows), (CPU_GROUP, 1), {f"WEIGHT_{down.layout}": 1})

    def _layer(self, layer: DeviceLinear, selected, k: int, n_experts: int, oc: int) -> list:
        """EXPERT_ARGS of linear.cl for a stacked layer whose experts have `oc` rows each (per half)."""
        spare = self.backend._or_placeholder
        return [layer.weight, spare(layer.scales), spare(layer.zeros), spare(layer.bias), selected,
                np.int32(layer.ic), np.int32(oc), np.int32(layer.block), np.int32(k), np.int32(n_experts),
                np.int32(layer.bias is not None)]

    def _stacked(self) -> tuple[DeviceLinear, DeviceLinear]:
        """(gate_up, down) of every expert, packed stacked on the first plan."""
        return stacked_experts(self.node, "opencl", lambda gate_ups, downs: (pack_experts(self.backend, gate_ups),
                                                                              pack_experts(self.backend, downs)))


def _kernel_widths(gate_ups: list, downs: list) -> str | None:
    if any(w.ic % 32 or (w.block_size if w.is_quantized else w.ic) % 32 for w in (gate_ups[0], downs[0])):
        return "the expert kernels read 32 inputs at a time, within one block"
    return None


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"Softmax": OpenCLSoftmax, "TopKV2": OpenCLTopK, "Reduction": OpenCLReduction,
              EXPERT_ADD: OpenCLExpertAdd, SPARSE_MOE: OpenCLSparseMoE}
