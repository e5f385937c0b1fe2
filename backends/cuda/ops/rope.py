"""The fused rotary embedding (the ROPE node of runtime/fusion.py and runtime/c4_ops.py) in one
kernel (shaders/cuda/rope.cu). x (1, seq, heads, dim); cos and sin hold one row of the rotated width
per position, shared by the heads. A node whose slices are not the rotate-half split of the last
axis, or whose cos and sin are laid out otherwise, is declined and runs on the CPU backup."""

from __future__ import annotations

import numpy as np

from mnngpu.backends.cuda.device import BLOCK, grid_for
from mnngpu.backends.cuda.ops.base import CUDAExecution
from mnngpu.ops.rope import ROPE, rotary_width, rotate_half_split


class CUDARoPE(CUDAExecution):
    @classmethod
    def decline(cls, inputs, outputs, node):
        if rotate_half_split(node, inputs) is None:
            return "not a rotate-half of x's last axis with one (cos, sin) row per position"
        return None

    def onResize(self, inputs, outputs):
        backend, (x, cos, sin), out = self.backend, inputs[:3], outputs[0]
        _, _, heads, dim = x.shape
        n = np.int32(out.size)
        args = (np.int32(heads), np.int32(dim), np.int32(rotary_width(self.node, x)),
                np.int32(rotate_half_split(self.node, inputs)), n, backend._buffer(x), backend._buffer(cos),
                backend._buffer(sin), backend._buffer(out))
        self.prepare("rope.cu", "rope_rotate_half", grid_for(n), (BLOCK,), args)


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {ROPE: CUDARoPE}
