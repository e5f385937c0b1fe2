"""Decoding a linear layer's weights (a 1x1 Convolution) into codes, scales and zeros.

Written once for every backend; each backend then packs `QuantizedLinear` into its own
kernel layout. Storage cases, chosen by `Convolution2D.quanParameter`:

* `type` 1 (IDST, the quantized export). The weight section is
      u8 ndim | ndim x u16 dims (u32 when shapeInt32) | u8 table size (0 = 256)
      | int8 table | codes, a bits-wide MSB-first stream over [oc][ic]
  with bits = ceil(log2(table size)). MNN sorts the table; code k stands for the
  value table[k]. The alpha section holds fp32 (or fp16, `scaleStorage`) values per
  (row, block), one block = ic / n_blocks consecutive inputs: `scale` when symmetric
  (readType == 0), `[min, scale]` pairs when asymmetric. MNN's weight is
      w = table[k] * scale + min'
  where min' = min - aMin*scale if aMin < 0 (aMin 0 reads as -128), and both are
  multiplied by quantScale when has_scaleInt is false and quantScale != 1.
* `type` 3: fp16 weights [oc][ic]. No quanParameter: fp32 weights [oc][ic].

Whatever the table, `codes` here are unsigned levels: code = table value + 2^(bits-1),
so that w = code * scale + zero with zero = min' - 2^(bits-1) * scale (symmetric:
zero = -2^(bits-1) * scale). For the linear table [-2^(b-1) .. 2^(b-1)-1] that the
exporter writes, the code is the stored index, and 4- and 8-bit codes stay views into
the weight file.

The bias (fp32 [oc]) follows the alpha section, or is inline in `Convolution2D.bias`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFormatError, WeightFileError
from .bits import pack_nibbles, packed_size, split_nibbles, unpack_codes
from .params import Convolution2D, IDSTQuan
from .weights import WeightFile

Rows = slice | Sequence[int] | np.ndarray


@dataclass
class QuantizedLinear:
    """One linear layer's weight [oc, ic] as codes * scales + zeros, per (row, block).

    bits 4: `codes` is uint8 [oc, ceil(ic/2)], element 2i in the high nibble.
    bits 8: uint8 [oc, ic]. Other widths (1, 2, 3, 5, 6, 7): uint8 [oc, ic], one code a byte.
    bits 16 / 32 (an unquantized export): `float_weight` holds the stored weight,
    float16 or float32 [oc, ic]; `codes`, `scales` and `zeros` are empty [oc, 0] arrays.
    """

    oc: int
    ic: int
    bits: int
    block_size: int  # inputs per block; == ic when channel-wise
    symmetric: bool
    codes: np.ndarray
    scales: np.ndarray  # float32 [oc, n_blocks]
    zeros: np.ndarray  # float32 [oc, n_blocks]
    bias: np.ndarray | None  # float32 [oc]
    float_weight: np.ndarray | None = None
    name: str = ""

    @property
    def is_quantized(self) -> bool:
        return self.float_weight is None

    @property
    def n_blocks(self) -> int:
        return self.ic // self.block_size

    def unpacked_codes(self, rows: Rows = slice(None)) -> np.ndarray:
        """uint8 [rows, ic], one code a byte."""
        if not self.is_quantized:
            raise ModelFormatError(f"a quantized weight; {self.name or 'this layer'} is {self.bits}-bit float")
        codes = self.codes[_index(rows)]
        if self.bits == 4:
            return split_nibbles(codes)[:, : self.ic]
        return codes

    def dequantize(self, rows: Rows = slice(None)) -> np.ndarray:
        """float32 [rows, ic]; only the requested rows are read from the file."""
        rows = _index(rows)
        if not self.is_quantized:
            return np.asarray(self.float_weight[rows], dtype=np.float32)
        codes = self.unpacked_codes(rows).astype(np.float32)
        codes = codes.reshape(codes.shape[0], self.n_blocks, self.block_size)
        weight = codes * self.scales[rows][:, :, None] + self.zeros[rows][:, :, None]
        return weight.reshape(-1, self.ic)


def _index(rows: Rows):
    return rows if isinstance(rows, slice) else np.asarray(rows, dtype=np.int64)


def read_linear(weights: WeightFile | None, conv: Convolution2D, name: str = "Convolution2D") -> QuantizedLinear:
    """Decode a 1x1 convolution's weight and bias. `weights` may be None when all is inline."""
    oc, ic = _linear_shape(conv, name)
    quan = conv.quanParameter
    external = conv.external if conv.external is not None and len(conv.external) > 1 else None
    if external is not None and weights is None:
        raise WeightFileError("a weight file: this layer's weights are external", field=f"{name}.external")
    if quan is None:
        return _read_float(weights, conv, external, oc, ic, "<f4", name)
    if quan.type == 2 or quan.index is not None or (external is not None and len(external) > 4 and external[4]):
        raise ModelFormatError("dense weights; sparse quantized convolutions are not supported",
                               field=f"{name}.quanParameter")
    if quan.type == 3:
        return _read_float(weights, conv, external, oc, ic, "<f2", name)
    if quan.type == 1:
        return _read_idst(weights, conv, quan, external, oc, ic, name)
    raise ModelFormatError(f"quanParameter.type 1 (quantized) or 3 (fp16), got {quan.type}",
                           field=f"{name}.quanParameter.type")


def _linear_shape(conv: Convolution2D, name: str) -> tuple[int, int]:
    common = conv.common
    if common is None:
        raise ModelFormatError("a Convolution2DCommon table", field=f"{name}.common")
    if common.group != 1:
        raise ModelFormatError(f"a convolution with group 1 (a linear layer), got group {common.group}",
                               field=f"{name}.common")
    if common.outputCount <= 0 or common.inputCount <= 0:
        raise ModelFormatError(f"positive outputCount/inputCount, got {common.outputCount}/{common.inputCount}",
                               field=f"{name}.common")
    # a kh x kw kernel reads inputCount*kh*kw values per output: [oc, ic, kh, kw] is a linear layer's
    # [oc, ic*kh*kw] (the shape rule admits such a kernel only where it covers its whole input)
    return common.outputCount, common.inputCount * common.kernelX * common.kernelY


@dataclass(frozen=True)
class _Site:
    """Where a section's bytes come from, for messages: the weight file and offset, or the graph inline."""

    path: object  # the weight file; None for bytes inline in the graph
    field: str

    def error(self, expected: str) -> ModelFormatError:
        return ModelFormatError(f"expected {expected}", path=self.path, field=self.field)


def _site(weights: WeightFile | None, external, skip: int, field: str) -> _Site:
    """The site of the section `skip` bytes after the external offset (or inline, without an external list)."""
    if external is None or weights is None:
        return _Site(None, field)
    return _Site(weights.path, f"{field} at offset {external[0] + skip}")


@dataclass
class _Sections:
    weight: np.ndarray  # raw bytes (uint8) of the weight section
    alpha: np.ndarray | None  # float32
    bias: np.ndarray | None  # float32 [oc]


def _external_sections(weights: WeightFile, external: list[int], alpha_dtype: str, name: str) -> _Sections:
    offset = external[0]
    sizes = list(external[1:4]) + [0] * (4 - len(external))
    weight_bytes, alpha_bytes, bias_bytes = sizes[:3]
    weight = weights.bytes(offset, weight_bytes, f"{name}.external[1] (weight)")
    alpha = _typed(weights, offset + weight_bytes, alpha_bytes, alpha_dtype, f"{name}.external[2] (alpha)")
    bias = _typed(weights, offset + weight_bytes + alpha_bytes, bias_bytes, "<f4", f"{name}.external[3] (bias)")
    return _Sections(weight, alpha, bias)


def _typed(weights: WeightFile, offset: int, length: int, dtype: str, what: str) -> np.ndarray | None:
    if length == 0:
        return None
    itemsize = np.dtype(dtype).itemsize
    if length % itemsize:
        raise WeightFileError(f"a whole number of {itemsize}-byte values, got {length} bytes",
                              path=weights.path, field=what)
    return weights.array(offset, dtype, length // itemsize, what).astype(np.float32)


def _read_float(weights, conv: Convolution2D, external, oc: int, ic: int, dtype: str, name: str) -> QuantizedLinear:
    if external is not None:
        # A float convolution's external list is [offset, weight_bytes, bias_bytes];
        # an fp16 one (quanParameter type 3) has the quantized layout with alpha_bytes == 0.
        layout = external if conv.quanParameter is not None else [external[0], external[1], 0, *external[2:3]]
        raw = weights.bytes(layout[0], layout[1], f"{name}.external[1] (weight)")
        bias = _external_sections(weights, layout, "<f4", name).bias
    elif conv.quanParameter is not None:
        raw = _inline_bytes(conv.quanParameter.buffer, f"{name}.quanParameter.buffer")
        bias = None
    else:
        raw = _inline_bytes(conv.weight, f"{name}.weight")
        bias = None
    itemsize = np.dtype(dtype).itemsize
    if raw.size != oc * ic * itemsize:
        raise _site(weights, external, 0, f"{name}.weight").error(
            f"{oc}x{ic} {dtype} weights ({oc * ic * itemsize} bytes), got {raw.size} bytes")
    bias = _pick_bias(conv.bias, bias, oc, name)
    empty = np.zeros((oc, 0), dtype=np.float32)
    return QuantizedLinear(oc=oc, ic=ic, bits=8 * itemsize, block_size=ic, symmetric=True,
                           codes=np.zeros((oc, 0), dtype=np.uint8), scales=empty, zeros=empty, bias=bias,
                           float_weight=raw.view(dtype).reshape(oc, ic), name=name)


def _inline_bytes(values: np.ndarray | None, field: str) -> np.ndarray:
    if values is None:
        raise ModelFormatError("inline weights or an external list", field=field)
    return values.view(np.uint8)


def _pick_bias(inline: np.ndarray | None, external: np.ndarray | None, oc: int, name: str) -> np.ndarray | None:
    bias = inline if inline is not None else external  # MNN prefers the inline bias
    if bias is not None and bias.size != oc:
        raise ModelFormatError(f"{oc} bias values, got {bias.size}", field=f"{name}.bias")
    return None if bias is None else np.asarray(bias, dtype=np.float32)


def _read_idst(weights, conv: Convolution2D, quan: IDSTQuan, external, oc: int, ic: int, name: str):
    alpha_dtype = "<f2" if quan.scaleStorage == "FP16" else "<f4"
    if external is not None:
        sections = _external_sections(weights, external, alpha_dtype, name)
    else:
        inline_alpha = quan.alphaFp16.view("<f2") if quan.scaleStorage == "FP16" else quan.alpha
        sections = _Sections(_inline_bytes(quan.buffer, f"{name}.quanParameter.buffer"),
                             None if inline_alpha is None else inline_alpha.astype(np.float32), None)
    where = _site(weights, external, 0, f"{name} weight section")
    table, stream = _parse_idst_header(sections.weight, quan.shapeInt32, oc, ic, where)
    bits, codes = _codes_from_table(table, stream, oc, ic, where)
    alpha_site = _site(weights, external, sections.weight.size, f"{name} alpha")
    scales, zeros, symmetric = _scales_and_zeros(sections.alpha, quan, oc, ic, bits, alpha_site)
    return QuantizedLinear(oc=oc, ic=ic, bits=bits, block_size=ic // scales.shape[1], symmetric=symmetric,
                           codes=codes, scales=scales, zeros=zeros,
                           bias=_pick_bias(conv.bias, sections.bias, oc, name), name=name)


def _parse_idst_header(buf: np.ndarray, shape_int32: bool, oc: int, ic: int, where: _Site):
    """(sorted int8 value table, uint8 code stream) of an IDST weight section."""
    def need(end: int, what: str) -> None:
        if end > buf.size:
            raise where.error(f"{what} within the {buf.size}-byte section")

    need(1, "the dimension count")
    ndim = int(buf[0])
    if not 1 <= ndim <= 4:
        raise where.error(f"1 to 4 dimensions, got {ndim}")
    dim_type = "<u4" if shape_int32 else "<u2"
    dims_end = 1 + ndim * np.dtype(dim_type).itemsize
    need(dims_end + 1, "the dims and table size")
    dims = buf[1:dims_end].view(dim_type).tolist()
    # [oc, ic], or MNN's converter's blocked [oc * blocks, ic / blocks]: the same codes in the same order
    if dims[0] % oc or int(np.prod(dims)) != oc * ic:
        raise where.error(f"dims [{oc}, {ic}] (from the graph), got {dims}")
    table_size = int(buf[dims_end]) or 256
    table_end = dims_end + 1 + table_size
    need(table_end, f"a {table_size}-entry value table")
    table = np.sort(buf[dims_end + 1: table_end].view(np.int8))
    bits = max(1, (table_size - 1).bit_length())
    need(table_end + packed_size(oc * ic, bits), f"{oc}x{ic} {bits}-bit codes")
    return table, buf[table_end: table_end + packed_size(oc * ic, bits)]


def _codes_from_table(table: np.ndarray, stream: np.ndarray, oc: int, ic: int, where: _Site):
    """(bits, codes) with codes as unsigned levels, in QuantizedLinear's layout."""
    bits = max(1, (table.size - 1).bit_length())
    half = 1 << (bits - 1)
    linear = table.size == 1 << bits and np.array_equal(table, np.arange(-half, half))
    if linear and bits == 8:
        return 8, stream.reshape(oc, ic)
    if linear and bits == 4 and ic % 2 == 0:
        return 4, stream.reshape(oc, ic // 2)
    index = unpack_codes(stream, bits, oc * ic)
    if not linear:
        if index.max(initial=0) >= table.size:
            raise where.error(f"codes below the table size {table.size}")
        values = table[index].astype(np.int16)
        if table.min() < -half or table.max() >= half:
            bits, half = 8, 128  # the table's values do not fit the index width
        index = (values + half).astype(np.uint8)
    codes = index.reshape(oc, ic)
    return bits, pack_nibbles(codes) if bits == 4 else codes


def _scales_and_zeros(alpha: np.ndarray | None, quan: IDSTQuan, oc: int, ic: int, bits: int, where: _Site):
    if alpha is None:
        raise where.error("scales (alpha) for a quantized weight")
    symmetric = quan.readType == 0
    per_pair = 1 if symmetric else 2
    groups, rest = divmod(alpha.size, per_pair)
    if rest or groups == 0 or groups % oc or ic % (groups // oc):
        raise where.error(f"{'one scale' if symmetric else 'a [min, scale] pair'} per (row, block) for "
                          f"{oc} rows of {ic}, got {alpha.size} values")
    n_blocks = groups // oc
    with np.errstate(over="ignore", invalid="ignore"):  # damaged scales overflow; the check below rejects them
        if symmetric:
            scale, low = alpha.astype(np.float32), np.zeros(groups, dtype=np.float32)
        else:
            low, scale = alpha[0::2].astype(np.float32), alpha[1::2].astype(np.float32)
            clamp_min = quan.aMin if quan.aMin != 0 else -128
            if clamp_min < 0:
                low = low - np.float32(clamp_min) * scale
        if not quan.has_scaleInt and quan.quantScale != 1.0:
            scale, low = scale * np.float32(quan.quantScale), low * np.float32(quan.quantScale)
        zeros = low - np.float32(1 << (bits - 1)) * scale
        finite = np.isfinite(scale * np.float32(1 << bits)).all() and np.isfinite(zeros).all()
    if not finite:
        raise where.error("finite scales and zero points (the alpha section looks damaged)")
    return scale.reshape(oc, n_blocks), zeros.reshape(oc, n_blocks), symmetric
