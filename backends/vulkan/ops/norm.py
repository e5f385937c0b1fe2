"""LayerNorm / RMSNorm (MNN's LayerNorm with useRMSNorm) over the last len(axis) axes."""

from __future__ import annotations

from mnngpu.backends.vulkan.ops.base import VulkanExecution, element_groups, padded
from mnngpu.backends.vulkan.program import pack_push
from mnngpu.ops import norm
from mnngpu.ops.elementwise import BINARY_CODES


class VulkanLayerNorm(VulkanExecution):
    @classmethod
    def pack(cls, backend, node):
        node.weights["vulkan_norm"] = norm.device_weights(node, backend._constant)

    @classmethod
    def decline(cls, inputs, outputs, node):
        return norm.decline(inputs, outputs, node)

    def onResize(self, inputs, outputs):
        backend = self.backend
        p = self.node.param
        n = norm.norm_width(p, outputs[-1].shape)
        rows = inputs[0].size // max(n, 1)
        if "vulkan_norm" not in self.node.weights:
            self.pack(backend, self.node)
        gamma, beta = self.node.weights["vulkan_norm"]
        x = inputs[0].device
        kernel, extra = "layer_norm", []
        if len(inputs) > 1:   # the residual sum, into output 0; its norm goes to output 1
            total = outputs[0].device = backend._new_tensor(outputs[0])
            if inputs[1].size == inputs[0].size:   # summed in the norm's own dispatch
                kernel, extra = "layer_norm_residual", [inputs[1].device, total]
            else:   # a broadcast add first
                push = pack_push("IIII6I6i6i", inputs[0].size, BINARY_CODES["ADD"], 1, 0,
                                 *padded((inputs[0].size,), ""), *padded((1,), ""), *padded((1,), ""))
                self.dispatch("binary_f32", [x, inputs[1].device, total], push, element_groups(inputs[0].size))
                x = total
        y = outputs[-1].device = backend._new_tensor(outputs[-1])
        push = pack_push("IIfIII", rows, n, float(p.epsilon), int(bool(p.useRMSNorm)), int(gamma is not None),
                         int(beta is not None))
        self.dispatch(kernel, [x, gamma or backend.placeholder, beta or backend.placeholder, y, *extra], push, rows,
                      **({"writes": (3, 5)} if extra else {}))


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"LayerNorm": VulkanLayerNorm}
