"""1x1 Convolution as a linear layer, y = x W^T + bias, with W kept quantized on the device.

Packing (at load, see shaders/vulkan/linear_weights.glsl): the weight is stored group-major,
each group of 8 inputs holding every output channel in turn, padded to a multiple of 4 channels:
int4 codes two a byte (byte j: input j low, input j + 4 high), 8-bit and narrower codes one a
byte, scales, zeros and bias as float32 [block][channel]. Unquantized layers, and blocks that are
not a whole number of groups of 8, are stored dense (fp16 at precision low where the device has
it). A layer whose arrays exceed maxStorageBufferRange (lavapipe: 128 MiB) is split into parts of
output channels, each with its own buffers and dispatch.

A MoE op's experts (fused.SparseMoE) are packed together instead: `pack_experts` stacks one row
range of every expert's layer, each laid out as above, in one part of one buffer per array, so the
expert kernels (linear_gemv -DEXPERT) index the chosen expert's slice. Their Convolutions are left
unpacked at load (`linear_weights` packs one at its first use where the MoE op stays dense).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mnngpu.backends.vulkan.memory import DeviceTensor
from mnngpu.backends.vulkan.ops.base import VulkanExecution
from mnngpu.backends.vulkan.program import pack_push
from mnngpu.ops.linear import GATED_LINEAR, LINEAR_GROUP, QuantizedLinear
from mnngpu.ops.routing import SPARSE_MOE, is_expert_op

GROUP = 8              # inputs per weight group
QUAD = 4               # output channels per invocation
GEMM_TILE_ROWS = 8     # linear_gemm.comp: activation rows per workgroup
GROUP_SIZE = 64        # invocations per workgroup
SPLIT_QUADS = 8        # linear_split.comp: quads of one row per workgroup (the width split 32 ways)
SPLIT_INVOCATIONS = 256   # linear_split.comp's workgroup, more than the 128 Vulkan guarantees
PACK_ROWS = 4096       # channels unpacked at a time while packing


@dataclass
class LinearPart:
    row0: int
    rows: int
    weight: DeviceTensor
    scales: DeviceTensor | None
    zeros: DeviceTensor | None
    bias: DeviceTensor | None


@dataclass
class PackedLinear:
    kind: str            # "q4" | "q8" | "dense_f32" | "dense_f16": the kernel variant
    oc: int
    ic: int
    block_size: int
    n_blocks: int
    parts: list[LinearPart]


def packable(weight: QuantizedLinear) -> bool:
    """The kernels read inputs in groups of 8 (vec4 pairs); other widths stay on the CPU."""
    return weight.ic % GROUP == 0


def weight_kind(weight: QuantizedLinear) -> str:
    if not weight.is_quantized or weight.block_size % GROUP != 0:
        return "dense"
    return "q4" if weight.bits == 4 else "q8" if weight.bits <= 8 else "dense"


def _padded(rows: int) -> int:
    return -(-rows // QUAD) * QUAD


def _group_major(per_row: np.ndarray, rows_pad: int) -> np.ndarray:
    """[rows, groups, ...] -> [groups, rows_pad, ...], padded channels zero."""
    out = np.zeros((per_row.shape[1], rows_pad, *per_row.shape[2:]), dtype=per_row.dtype)
    out[:, : per_row.shape[0]] = per_row.swapaxes(0, 1)
    return out


def _codes_rows(weight: QuantizedLinear, kind: str, start: int, stop: int) -> np.ndarray:
    """uint32 [rows, words] of one channel range, in the kernels' byte order."""
    levels = weight.unpacked_codes(slice(start, stop))          # uint8 [rows, ic]
    if kind == "q4":
        groups = levels.reshape(stop - start, -1, GROUP)
        levels = groups[:, :, :4] | (groups[:, :, 4:] << 4)
    return np.ascontiguousarray(levels).reshape(stop - start, -1).view(np.uint32)


def _pack_rows(weight: QuantizedLinear, kind: str, dtype, start: int, stop: int) -> np.ndarray:
    rows_pad = _padded(stop - start)
    chunks = []
    for first in range(start, stop, PACK_ROWS):
        last = min(stop, first + PACK_ROWS)
        if kind == "dense":
            chunks.append(weight.dequantize(slice(first, last)).astype(dtype).reshape(last - first, -1, GROUP))
        else:
            chunks.append(_codes_rows(weight, kind, first, last))
    return _group_major(np.concatenate(chunks, axis=0), rows_pad)


def _per_channel(values: np.ndarray | None, start: int, stop: int) -> np.ndarray | None:
    """float32 [blocks, rows_pad] (or [rows_pad] for a bias) of one channel range."""
    if values is None:
        return None
    part = np.asarray(values[start:stop], dtype=np.float32)
    if part.ndim == 1:
        return _group_major(part[:, None], _padded(stop - start))[0]
    return _group_major(part, _padded(stop - start))


def _row_bytes(weight: QuantizedLinear, kind: str, item: int) -> int:
    """The most bytes one output channel adds to any one of the layer's buffers."""
    codes = {"q4": weight.ic // 2, "q8": weight.ic, "dense": weight.ic * item}[kind]
    return max(codes, 4 * (weight.n_blocks if kind != "dense" else 1))


def pack_linear(backend, weight: QuantizedLinear) -> PackedLinear:
    kind = weight_kind(weight)
    dtype = backend.store_dtype
    rows_per_part = max(QUAD, backend.max_binding_bytes // _row_bytes(weight, kind, dtype.itemsize) // QUAD * QUAD)
    parts = []
    for start in range(0, weight.oc, rows_per_part):
        stop = min(weight.oc, start + rows_per_part)
        quantized = kind != "dense"
        scales = backend._constant(_per_channel(weight.scales, start, stop)) if quantized else None
        zeros = backend._constant(_per_channel(weight.zeros, start, stop)) if quantized else None
        bias = None if weight.bias is None else backend._constant(_per_channel(weight.bias, start, stop))
        packed = backend._constant(_pack_rows(weight, kind, dtype, start, stop))
        parts.append(LinearPart(start, stop - start, packed, scales, zeros, bias))
    block = weight.block_size if kind != "dense" else weight.ic
    name = backend._kernel_name("dense") if kind == "dense" else kind
    return PackedLinear(name, weight.oc, weight.ic, block, weight.ic // block, parts)


def linear_weights(backend, node) -> PackedLinear:
    """The node's packed weights, packing them now where the load left them raw (an expert's)."""
    if "vulkan" not in node.weights:
        node.weights["vulkan"] = pack_linear(backend, node.weights.pop("weight"))
    return node.weights["vulkan"]


def stacked_bytes(weights: list[QuantizedLinear], rows: int, item: int) -> int:
    """The largest buffer `pack_experts` makes for `rows` channels of every expert's layer."""
    return len(weights) * _padded(rows) * _row_bytes(weights[0], weight_kind(weights[0]), item)


def pack_experts(backend, weights: list[QuantizedLinear], start: int, stop: int) -> PackedLinear:
    """Channels [start, stop) of every expert's layer (same_layout), stacked expert after expert in
    one part; expert e's arrays begin at e times one expert's size."""
    first = weights[0]
    kind = weight_kind(first)
    quantized = kind != "dense"

    def stack(arrays) -> DeviceTensor | None:
        return None if arrays[0] is None else backend._constant(np.stack(arrays))

    packed = stack([_pack_rows(w, kind, backend.store_dtype, start, stop) for w in weights])
    scales = stack([_per_channel(w.scales, start, stop) for w in weights]) if quantized else None
    zeros = stack([_per_channel(w.zeros, start, stop) for w in weights]) if quantized else None
    bias = stack([_per_channel(w.bias, start, stop) for w in weights])
    block = first.block_size if quantized else first.ic
    name = backend._kernel_name("dense") if not quantized else kind
    part = LinearPart(0, stop - start, packed, scales, zeros, bias)
    return PackedLinear(name, stop - start, first.ic, block, first.ic // block, [part])


def _members(node) -> list:
    """The Convolution nodes an Execution runs: the node itself, or a fused node's members."""
    return list(node.param.members) if node.type in (LINEAR_GROUP, GATED_LINEAR) else [node]


class VulkanLinear(VulkanExecution):
    """Convolution; LinearGroup (several layers on one input, one output each); GatedLinear
    (members [gate, up], one output up * silu(gate), in one kernel)."""

    @classmethod
    def pack(cls, backend, node):
        if node.type != "Convolution" or not packable(node.weights["weight"]):
            return   # a fused node's members are packed one by one; an unpackable layer goes to the CPU
        if is_expert_op(node.name) and SPARSE_MOE in backend.executions:
            return   # packed with the other experts of its MoE op (ops/routing.py), or at first use
        node.weights["vulkan"] = pack_linear(backend, node.weights.pop("weight"))

    @classmethod
    def decline(cls, inputs, outputs, node):
        for member in _members(node):
            if "vulkan" not in member.weights:
                raw = member.weights.get("weight")
                if raw is None:
                    return "its weights were not packed for Vulkan"
                if not packable(raw):
                    return f"input width {raw.ic} is not a multiple of {GROUP}"
        if node.type == GATED_LINEAR:
            gate, up = (_layout(m.weights) for m in _members(node))
            if gate != up:
                return "gate and up weights differ in kind or shape"
        return None

    def onResize(self, inputs, outputs):
        backend = self.backend
        packed = [linear_weights(backend, m) for m in _members(self.node)]
        x = inputs[0].device
        n = inputs[0].size // packed[0].ic
        if self.node.type == GATED_LINEAR:
            self.record(packed[0], x, backend._new_tensor(outputs[0]), n, outputs[0], up=packed[1])
            return
        for layer, out in zip(packed, outputs):
            self.record(layer, x, backend._new_tensor(out), n, out)

    def record(self, packed: PackedLinear, x: DeviceTensor, y: DeviceTensor, n: int, out, up=None) -> None:
        out.device = y
        gemv = n == 1
        # a GPU needs more threads than one per quad, where its workgroups are large enough
        split = self.backend.variant == "gpu" and self.backend.device.max_invocations >= SPLIT_INVOCATIONS
        form = "split" if split else "gemv" if gemv else "gemm"
        kernel = f"linear_{form}_{packed.kind}" + ("_gated" if up is not None else "")
        spare = self.backend.placeholder
        for i, part in enumerate(packed.parts):
            push = pack_push("8I", part.rows, packed.ic, packed.block_size, packed.n_blocks, part.row0, packed.oc,
                             int(part.bias is not None), n)
            bindings = [x, *_part_buffers(part, spare), y]
            if up is not None:
                bindings += _part_buffers(up.parts[i], spare)
            quad_groups = -(-part.rows // (QUAD * (SPLIT_QUADS if split else GROUP_SIZE)))
            groups = (quad_groups, n, 1) if split else quad_groups if gemv else \
                (quad_groups, -(-n // GEMM_TILE_ROWS), 1)
            self.dispatch(kernel, bindings, push, groups, writes=(5,))


def _layout(weights: dict) -> tuple:
    """(kind, ic, oc, block) of a layer, packed or still raw."""
    packed = weights.get("vulkan")
    if packed is not None:
        return packed.kind.split("_")[0], packed.ic, packed.oc, packed.block_size
    raw = weights["weight"]
    kind = weight_kind(raw)
    return kind, raw.ic, raw.oc, raw.block_size if kind != "dense" else raw.ic


def _part_buffers(part: LinearPart, spare: DeviceTensor) -> list[DeviceTensor]:
    return [part.weight, part.scales or spare, part.zeros or spare, part.bias or spare]


# This family's rows of the backend's op table (ops/__init__.py merges the families).
EXECUTIONS = {"Convolution": VulkanLinear, LINEAR_GROUP: VulkanLinear, GATED_LINEAR: VulkanLinear}
