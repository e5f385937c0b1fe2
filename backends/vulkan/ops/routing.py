"""The MoE router's ops (Softmax, TopKV2, Reduction) and the EXPERT_ADD node on the device
(shaders/vulkan/routing.comp), so a MoE layer's routing stays in the recorded commands."""

from __future__ import annotations

from mnngpu.backends.vulkan.ops.base import VulkanExecution, element_groups
from mnngpu.backends.vulkan.program import pack_push
from mnngpu.ops import routing


class VulkanRouting(VulkanExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        return routing.decline(node, inputs)

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
        return routing.decline(node, inputs)

    def onResize(self, inputs, outputs):
        y, weights, selected = inputs[:3]
        acc = inputs[3].device if len(inputs) > 3 else self.backend.placeholder
        out = outputs[0].device = self.backend._new_tensor(outputs[0])
        rows = y.shape[0]
        push = pack_push("IIIiI", rows, y.size // rows, self.node.param.top_k, self.node.param.expert,
                         int(len(inputs) > 3))
        self.dispatch("routing_expert_add", [y.device, weights.device, selected.device, acc, out], push,
                      element_groups(y.size))
