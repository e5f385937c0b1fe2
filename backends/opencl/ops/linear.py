"""1x1 Convolution as a linear layer, with the weight kept quantized on the device.

Layouts (linear.cl): int4 with ic and the block a multiple of 32 is repacked so that each
32 inputs' 16 bytes unpack into two float16 vectors (byte j: input j low, j+16 high);
other quantized widths are one code a byte; float weights are stored as the activations are
(fp32 or fp16). Kernels by variant and rows of x:
    cpu: linear_rows_gemv / linear_rows_gemm (registers only), linear_generic for odd shapes
    gpu: linear_gemv_group (one row of x), linear_gemm_tiled (local-memory tiles)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from mnngpu.backends.opencl.ops.base import KernelExecution

ROWS = TOKENS = 4   # outputs and rows of x per work-item in linear_rows_*
CPU_GROUP = 16      # work-items per group: PoCL spreads groups, not items, over its threads
GEMM_GROUP_OUTPUTS = 4  # linear_rows_gemm work-items along the outputs per group
GEMV_WG, TILE = 64, 16
REPACK_ROWS = 4096  # rows repacked at a time, to bound the temporary unpacked codes


@dataclass
class DeviceLinear:
    oc: int
    ic: int
    block: int
    layout: str              # "Q4", "Q8" or "DENSE" (linear.cl's WEIGHT_<layout>)
    weight: cl.Buffer
    scales: cl.Buffer | None
    zeros: cl.Buffer | None
    bias: cl.Buffer | None

    @property
    def vectorizable(self) -> bool:
        """linear_rows_* read 32 inputs at a time, all within one block."""
        return self.ic % 32 == 0 and self.block % 32 == 0


def group_nibbles(codes: np.ndarray) -> np.ndarray:
    """uint8 [rows, ic] one code a byte -> [rows, ic/2]: per 32 inputs, byte j = code j | code j+16 << 4."""
    rows, ic = codes.shape
    groups = codes.reshape(rows, ic // 32, 2, 16)
    return (groups[:, :, 0] | (groups[:, :, 1] << 4)).astype(np.uint8).reshape(rows, ic // 2)


def pack_linear(backend, weight) -> DeviceLinear:
    device = backend.device
    bias = None if weight.bias is None else device.constant(np.asarray(weight.bias, dtype=np.float32))
    if not weight.is_quantized:
        dense = np.asarray(weight.float_weight, dtype=backend.float_storage)
        return DeviceLinear(weight.oc, weight.ic, weight.ic, "DENSE", device.constant(dense), None, None, bias)
    scales = device.constant(np.asarray(weight.scales, dtype=np.float32))
    zeros = device.constant(np.asarray(weight.zeros, dtype=np.float32))
    if weight.bits == 4 and weight.ic % 32 == 0 and weight.block_size % 32 == 0:
        codes = np.concatenate([group_nibbles(weight.unpacked_codes(slice(start, start + REPACK_ROWS)))
                                for start in range(0, weight.oc, REPACK_ROWS)])
        layout = "Q4"
    else:
        codes, layout = weight.unpacked_codes(), "Q8"
    return DeviceLinear(weight.oc, weight.ic, weight.block_size, layout, device.constant(codes), scales, zeros, bias)


class LinearExecution(KernelExecution):
    def plan(self, inputs, outputs):
        w: DeviceLinear = self.node.weights["opencl"]
        n = inputs[0].size // w.ic
        or_placeholder = self.backend._or_placeholder
        args = [outputs[0], inputs[0], w.weight,
                or_placeholder(w.scales), or_placeholder(w.zeros), or_placeholder(w.bias),
                np.int32(n), np.int32(w.ic), np.int32(w.oc), np.int32(w.block), np.int32(w.bias is not None)]
        defines = {f"WEIGHT_{w.layout}": 1}
        if self.backend.variant == "gpu":
            if n == 1:
                self.prepare("linear.cl", "linear_gemv_group", args, (w.oc * GEMV_WG,), (GEMV_WG,), defines)
            else:
                self.prepare("linear.cl", "linear_gemm_tiled", args, (w.oc, n), (TILE, TILE), defines)
        elif w.vectorizable and n == 1:
            self.prepare("linear.cl", "linear_rows_gemv", args, (-(-w.oc // ROWS),), (CPU_GROUP,), defines)
        elif w.vectorizable:
            # A group spans every row of x, so the weight rows it reads are reused from cache.
            token_items = -(-n // TOKENS)
            group = (GEMM_GROUP_OUTPUTS, min(token_items, 64))
            self.prepare("linear.cl", "linear_rows_gemm", args, (-(-w.oc // ROWS), token_items), group, defines)
        else:
            self.prepare("linear.cl", "linear_generic", args, (w.oc, n), (CPU_GROUP, 1), defines)
