"""The fused rotary embedding (runtime/fusion.py's ROPE node): one dispatch for the seven ops
of rotate-half. Where the pattern does not hold at resize (rope_split is None), or cos and sin
are not rows of the rotated width broadcast over x, the node is declined and runs on the CPU backup."""

from __future__ import annotations

import numpy as np

from mnngpu.backend.movement import broadcast_strides, coalesce, contiguous_strides
from mnngpu.backends.vulkan.ops.base import VulkanExecution, element_groups, padded
from mnngpu.backends.vulkan.program import pack_push
from mnngpu.ops.rope import ROPE, rope_split, rotary_width


class VulkanRoPE(VulkanExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        x, cos, sin = inputs[:3]
        rotary = rotary_width(node, x)
        rows = all(t.shape and t.shape[-1] == rotary and tuple(np.broadcast_shapes(t.shape[:-1], x.shape[:-1]))
                   == tuple(x.shape[:-1]) for t in (cos, sin))
        if not rows:
            return f"cos and sin are not rows of the {rotary} rotated dims broadcast over x"
        return None if rope_split(node, inputs) is not None else "the slices are not a rotate-half"

    def onResize(self, inputs, outputs):
        x, cos, sin = inputs[:3]
        out = outputs[0]
        y = out.device = self.backend._new_tensor(out)
        outer, rotary = tuple(x.shape[:-1]), rotary_width(self.node, x)
        strides = [[step * rotary for step in broadcast_strides(t.shape[:-1], outer)] for t in (cos, sin)]
        shape, (cos_strides, sin_strides, _) = coalesce(outer, *strides, contiguous_strides(outer))
        what = f"RoPE {self.node.name}"
        push = pack_push("4I6I6i6iI", out.size, x.shape[-1], rope_split(self.node, inputs), len(shape),
                         *padded(shape, what), *padded(cos_strides, what), *padded(sin_strides, what), rotary)
        self.dispatch("rope", [x.device, cos.device, sin.device, y], push, element_groups(out.size))


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {ROPE: VulkanRoPE}
