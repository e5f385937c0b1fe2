"""1x1 Convolution as a linear layer, with the weight kept quantized on the device.

Layouts (linear.cl): int4 with ic and the block a multiple of 32 is repacked so that each
32 inputs' 16 bytes unpack into two float16 vectors (byte j: input j low, j+16 high);
other quantized widths are one code a byte; float weights are stored as the activations are
(fp32 or fp16). Kernels by variant and rows of x:
    cpu: linear_rows_gemv / linear_rows_gemm (registers only), linear_generic for odd shapes
    gpu: linear_gemv_group (one row of x), linear_gemm_tiled (local-memory tiles)

A MoE op's experts (fused.SparseMoE, ops/routing.py) are packed together instead: `pack_experts`
stacks every expert's arrays, expert after expert, in one buffer each. Their Convolutions are
left unpacked at load (`linear_weights` packs one at its first use where the MoE op stays dense).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from mnngpu.backends.opencl.ops.base import OpenCLExecution
from mnngpu.ops.routing import SPARSE_MOE, is_expert_op

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


def _arrays(backend, weight) -> tuple[str, int, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(layout, block, codes or dense weight, scales, zeros) of a layer, as the kernels read them."""
    if not weight.is_quantized:
        return "DENSE", weight.ic, np.asarray(weight.float_weight, dtype=backend.float_storage), None, None
    scales, zeros = (np.asarray(a, dtype=np.float32) for a in (weight.scales, weight.zeros))
    if weight.bits == 4 and weight.ic % 32 == 0 and weight.block_size % 32 == 0:
        codes = np.concatenate([group_nibbles(weight.unpacked_codes(slice(start, start + REPACK_ROWS)))
                                for start in range(0, weight.oc, REPACK_ROWS)])
        return "Q4", weight.block_size, codes, scales, zeros
    return "Q8", weight.block_size, weight.unpacked_codes(), scales, zeros


def _constant(device, array: np.ndarray | None) -> cl.Buffer | None:
    return None if array is None else device.constant(array)


def pack_linear(backend, weight) -> DeviceLinear:
    layout, block, codes, scales, zeros = _arrays(backend, weight)
    bias = None if weight.bias is None else np.asarray(weight.bias, dtype=np.float32)
    device = backend.device
    return DeviceLinear(weight.oc, weight.ic, block, layout, device.constant(codes), _constant(device, scales),
                        _constant(device, zeros), _constant(device, bias))


def linear_weights(backend, node) -> DeviceLinear:
    """The node's packed weights, packing them now where the load left them raw (an expert's)."""
    if "opencl" not in node.weights:
        node.weights["opencl"] = pack_linear(backend, node.weights.pop("weight"))
    return node.weights["opencl"]


def pack_experts(backend, weights: list) -> DeviceLinear:
    """Every expert's layer (alike in kind and shape), stacked expert after expert: a DeviceLinear
    of len(weights) * oc rows whose expert e is rows [e * oc, (e + 1) * oc)."""
    packed = [_arrays(backend, w) for w in weights]
    layout, block = packed[0][:2]
    first = weights[0]
    stacked = [None if packed[0][i] is None else np.concatenate([p[i] for p in packed]) for i in (2, 3, 4)]
    bias = None if first.bias is None else np.concatenate([np.asarray(w.bias, dtype=np.float32) for w in weights])
    device = backend.device
    return DeviceLinear(len(weights) * first.oc, first.ic, block, layout,
                        *(_constant(device, a) for a in (*stacked, bias)))


class OpenCLLinear(OpenCLExecution):
    @classmethod
    def pack(cls, backend, node):
        if is_expert_op(node.name) and SPARSE_MOE in backend.executions:
            return   # packed with the other experts of its MoE op (ops/routing.py), or at first use
        node.weights["opencl"] = pack_linear(backend, node.weights.pop("weight"))

    def plan(self, inputs, outputs):
        w = linear_weights(self.backend, self.node)
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


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"Convolution": OpenCLLinear}
