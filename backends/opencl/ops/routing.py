"""The MoE router's ops (Softmax, TopKV2, Reduction) and the EXPERT_ADD node on the device
(shaders/opencl/routing.cl), so a MoE layer's routing never leaves the device."""

from __future__ import annotations

import numpy as np

from mnngpu.backends.opencl.ops.base import KernelExecution
from mnngpu.ops import routing


def _lines(node, inputs) -> tuple[int, int, int]:
    return routing.layout(inputs[0].shape, routing.axes_of(node, inputs))


class RoutingExecution(KernelExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        return routing.decline(node, inputs)


class SoftmaxExecution(RoutingExecution):
    def plan(self, inputs, outputs):
        outer, n, inner = _lines(self.node, inputs)
        args = [outputs[0], inputs[0], np.int32(outer), np.int32(n), np.int32(inner)]
        self.prepare("routing.cl", "softmax_lines", args, (outer * inner,))


class TopKExecution(RoutingExecution):
    def plan(self, inputs, outputs):
        outer, n, inner = _lines(self.node, inputs)
        k = routing.top_k_count(inputs)
        args = [outputs[0], outputs[1], inputs[0], np.int32(outer), np.int32(n), np.int32(inner), np.int32(k)]
        self.prepare("routing.cl", "top_k_lines", args, (outer * inner,))


class ReductionExecution(RoutingExecution):
    def plan(self, inputs, outputs):
        outer, n, inner = _lines(self.node, inputs)
        op = routing.REDUCE_CODES[self.node.param.operation]
        args = [outputs[0], inputs[0], np.int32(outer), np.int32(n), np.int32(inner), np.int32(op)]
        self.prepare("routing.cl", "reduce_lines", args, (outer * inner,))


class ExpertAddExecution(RoutingExecution):
    def plan(self, inputs, outputs):
        y, weights, selected = inputs[:3]
        acc = inputs[3] if len(inputs) > 3 else self.backend.placeholder
        rows = y.shape[0]
        args = [outputs[0], y, weights, selected, acc, np.int32(rows), np.int32(y.size // rows),
                np.int32(self.node.param.top_k), np.int32(self.node.param.expert), np.int32(len(inputs) > 3)]
        self.prepare("routing.cl", "expert_add", args, (y.size,))
