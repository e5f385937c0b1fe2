"""LayerNorm / RMSNorm over the last axes (MNN's LayerNorm with useRMSNorm) on the device."""

from __future__ import annotations

import numpy as np

from mnngpu.backends.opencl.ops.base import OpenCLExecution
from mnngpu.ops import norm

NORM_WG = 64    # norm_group's work-group size (norm.cl)
ROWS_GROUP = 4  # rows per work-group in norm_rows


class OpenCLLayerNorm(OpenCLExecution):
    @classmethod
    def pack(cls, backend, node):
        node.weights["opencl"] = norm.device_weights(node, backend.device.constant)

    @classmethod
    def decline(cls, inputs, outputs, node):
        return norm.decline(inputs, outputs, node)

    def plan(self, inputs, outputs):
        p = self.node.param
        x = inputs[0]
        or_placeholder = self.backend._or_placeholder
        residual = [or_placeholder(None), or_placeholder(None), np.int32(0)]
        if len(inputs) > 1:   # the residual sum, into output 0; its norm goes to output 1
            if inputs[1].size == x.size:   # summed in the norm's own launch
                residual = [inputs[1], outputs[0], np.int32(1)]
            else:
                self.prepare("elementwise.cl", "binary_flat_ADD", [outputs[0], x, inputs[1], np.int32(x.size)],
                             (x.size,))
                x = outputs[0]
        width = norm.norm_width(p, x.shape)
        rows = x.size // width
        gamma, beta = self.node.weights["opencl"]
        args = [outputs[-1], x, or_placeholder(gamma), or_placeholder(beta),
                np.int32(rows), np.int32(width), np.float32(p.epsilon), np.int32(bool(p.useRMSNorm)),
                np.int32(gamma is not None), np.int32(beta is not None), *residual]
        if self.backend.variant == "gpu":
            self.prepare("norm.cl", "norm_group", args, (rows * NORM_WG,), (NORM_WG,))
        else:
            self.prepare("norm.cl", "norm_rows", args, (rows,), (ROWS_GROUP,))


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"LayerNorm": OpenCLLayerNorm}
