"""The op parameter tables of an MNN graph, one dataclass per schema table.

Field names, order and defaults are MNN's (schema/default/*.fbs), so a decoded table
lines up with `mnnconvert`'s JSON dump key for key. Enum fields hold the enum NAME
("MUL_SILU", "DT_INT32", "NC4HW4"). Absent vectors and tables are None. Short integer
vectors (shapes, axes, `external` offsets) are list[int]; bulk data (weights, constants,
scale tables) are read-only numpy views into the file buffer.

`PARAM_TABLES` maps an `OpParameter` union member name to its class; a member that is
not listed there decodes to `UnknownParam(type_name)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFormatError
from . import enums as E
from .schema import (
    BOOL,
    F32,
    I8,
    I32,
    U32,
    Array,
    ByteEnum,
    Enum,
    EnumList,
    IntList,
    Skip,
    String,
    StringList,
    Sub,
    SubList,
    fb,
    flat_table,
)

DATA_TYPE = Enum(E.DATA_TYPE)
DATA_FORMAT = ByteEnum(E.DATA_FORMAT)


@dataclass
class UnknownParam:
    """An `OpParameter` union member this reader does not decode (or does not know)."""

    type_name: str


# --- Tensor.fbs -------------------------------------------------------------------------

# Blob.dataType -> (the vector that holds the data, numpy dtype of the values it yields)
_BLOB_STORAGE: dict[str, tuple[str, str]] = {
    "DT_FLOAT": ("float32s", "<f4"),
    "DT_INT32": ("int32s", "<i4"),
    "DT_INT64": ("int64s", "<i8"),
    "DT_UINT8": ("uint8s", "u1"),
    "DT_QUINT8": ("uint8s", "u1"),
    "DT_INT8": ("int8s", "i1"),
    "DT_QINT8": ("int8s", "i1"),
    "DT_HALF": ("uint8s", "<f2"),
    "DT_BFLOAT16": ("uint8s", "<u2"),
}


@flat_table
class Blob:
    dims: list[int] | None = fb(IntList())
    dataFormat: str = fb(DATA_FORMAT, "NCHW")
    dataType: str = fb(DATA_TYPE, "DT_FLOAT")
    uint8s: np.ndarray | None = fb(Array("u1"))
    int8s: np.ndarray | None = fb(Array("i1"))
    int32s: np.ndarray | None = fb(Array("<i4"))
    int64s: np.ndarray | None = fb(Array("<i8"))
    float32s: np.ndarray | None = fb(Array("<f4"))
    strings: list[str] | None = fb(StringList())
    external: list[int] | None = fb(IntList("<i8"))  # [offset, bytes] into the weight file

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.dims or ())

    def array(self, weights=None) -> np.ndarray:
        """The constant as an array of `shape`.

        fp16 (DT_HALF) and bf16 constants are widened to float32, as MNN does when it
        loads a DT_HALF constant. A constant stored in the weight file (`external`)
        needs that file: pass a `WeightFile`.
        """
        if self.dataType not in _BLOB_STORAGE:
            raise ModelFormatError(f"a Blob dataType mnngpu reads, got {self.dataType}", field="Blob.dataType")
        if any(d < 0 for d in self.shape):
            raise ModelFormatError(f"non-negative dims, got {list(self.shape)}", field="Blob.dims")
        vector, dtype = _BLOB_STORAGE[self.dataType]
        count = math.prod(self.shape)
        if self.external is not None and len(self.external) > 1:
            raw = self._external_values(weights, dtype, count)
        else:
            raw = self._inline_values(vector, dtype, count)
        if self.dataType == "DT_BFLOAT16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        elif self.dataType == "DT_HALF":
            raw = raw.astype(np.float32)
        return raw.reshape(self.shape)

    def _inline_values(self, vector: str, dtype: str, count: int) -> np.ndarray:
        stored = getattr(self, vector)
        if stored is None:
            stored = np.zeros(0, dtype=dtype)
        if vector == "uint8s" and dtype != "u1":
            if stored.size % np.dtype(dtype).itemsize:
                raise ModelFormatError(f"a whole number of {dtype} values in uint8s", field="Blob.uint8s")
            stored = stored.view(dtype)
        if stored.size != count:
            raise ModelFormatError(f"{count} values for dims {list(self.shape)}, found {stored.size}",
                                   field=f"Blob.{vector}")
        return stored

    def _external_values(self, weights, dtype: str, count: int) -> np.ndarray:
        offset, length = self.external[0], self.external[1]
        if weights is None:
            raise ModelFormatError("a WeightFile to read this constant from (it is stored externally)",
                                   field="Blob.external")
        if length != count * np.dtype(dtype).itemsize:
            raise ModelFormatError(f"{count} values of {dtype} ({count * np.dtype(dtype).itemsize} bytes) "
                                   f"for dims {list(self.shape)}, external says {length} bytes",
                                   field="Blob.external")
        return weights.array(offset, dtype, count, "Blob.external")


@flat_table
class ListValue:
    s: list[str] | None = fb(StringList())
    i: list[int] | None = fb(IntList())
    f: np.ndarray | None = fb(Array("<f4"))
    b: np.ndarray | None = fb(Array("?"))
    type: list[str] | None = fb(EnumList(E.DATA_TYPE))


@flat_table
class Attribute:
    s: str | None = fb(String())
    i: int = fb(I32, 0)
    b: bool = fb(BOOL, False)
    key: str | None = fb(String())
    type: str = fb(DATA_TYPE, "DT_INVALID")
    f: float = fb(F32, 0.0)
    tensor: Blob | None = fb(Sub(Blob))
    list: ListValue | None = fb(Sub(ListValue))
    func: NamedAttrList | None = fb(Sub("NamedAttrList"))


@flat_table
class NamedAttrList:
    name: str | None = fb(String())
    attr: list[Attribute] | None = fb(SubList(Attribute))


# --- CaffeOp.fbs ------------------------------------------------------------------------

@flat_table
class Convolution2DCommon:
    padX: int = fb(I32, 0)
    padY: int = fb(I32, 0)
    kernelX: int = fb(I32, 1)
    kernelY: int = fb(I32, 1)
    strideX: int = fb(I32, 1)
    strideY: int = fb(I32, 1)
    dilateX: int = fb(I32, 1)
    dilateY: int = fb(I32, 1)
    padMode: str = fb(ByteEnum(E.PAD_MODE), "CAFFE")
    group: int = fb(I32, 1)
    outputCount: int = fb(I32, 0)
    inputCount: int = fb(I32, 0)
    relu: bool = fb(BOOL, False)
    relu6: bool = fb(BOOL, False)
    pads: list[int] | None = fb(IntList())
    outPads: list[int] | None = fb(IntList())
    hasOutputShape: bool = fb(BOOL, False)


@flat_table
class Pool:
    padX: int = fb(I32, 0)
    padY: int = fb(I32, 0)
    isGlobal: bool = fb(BOOL, False)
    kernelX: int = fb(I32, 0)
    kernelY: int = fb(I32, 0)
    strideX: int = fb(I32, 0)
    strideY: int = fb(I32, 0)
    type: str = fb(ByteEnum(E.POOL_TYPE), "MAXPOOL")
    padType: str = fb(ByteEnum(E.POOL_PAD_TYPE), "CAFFE")
    dataType: str = fb(DATA_TYPE, "DT_FLOAT")
    ceilModel: bool = fb(BOOL, True)
    pads: list[int] | None = fb(IntList())
    countType: str = fb(ByteEnum(E.AVG_POOL_COUNT_TYPE), "DEFAULT")


@flat_table
class SparseCommon:
    method: str = fb(ByteEnum(E.SPARSE_ALGO), "RANDOM")
    args: list[Attribute] | None = fb(SubList(Attribute))


@flat_table
class IDSTQuan:
    """Weight quantization of a convolution. type: 1 IDST int, 2 sparse, 3 fp16, 4 int8 only."""

    buffer: np.ndarray | None = fb(Array("i1"))
    alpha: np.ndarray | None = fb(Array("<f4"))
    type: int = fb(I32, 0)
    useInt32: bool = fb(BOOL, False)
    quantScale: float = fb(F32, 0.0)
    scaleIn: float = fb(F32, 0.0)
    scaleOut: float = fb(F32, 0.0)
    aMaxOrBits: int = fb(I32, 0)
    aMin: int = fb(I32, 0)
    readType: int = fb(I32, 0)
    has_scaleInt: bool = fb(BOOL, False)
    shapeInt32: bool = fb(BOOL, False)
    weightSize: int = fb(U32, 0)
    index: np.ndarray | None = fb(Array("<u4"))
    alphaFp16: np.ndarray | None = fb(Array("<u2"))
    scaleStorage: str = fb(ByteEnum(E.SCALE_STORAGE), "FP32")


@flat_table
class QuantizedFloatParam:
    weight: np.ndarray | None = fb(Array("i1"))
    bias: np.ndarray | None = fb(Array("<i4"))
    scale: np.ndarray | None = fb(Array("<f4"))
    tensorScale: np.ndarray | None = fb(Array("<f4"))
    method: str = fb(ByteEnum(E.QUANTIZE_ALGO), "DEFAULT")
    nbits: int = fb(I32, 8)
    zeroPoint: int = fb(I8, 0)
    outputZeroPoint: int = fb(I8, 0)
    clampMin: int = fb(I8, -128)
    clampMax: int = fb(I8, 127)
    winogradAttr: list[int] | None = fb(IntList())
    outputDataType: str = fb(DATA_TYPE, "DT_INT8")
    floatzeros: np.ndarray | None = fb(Array("<f4"))


@flat_table
class Convolution2D:
    common: Convolution2DCommon | None = fb(Sub(Convolution2DCommon))
    weight: np.ndarray | None = fb(Array("<f4"))
    bias: np.ndarray | None = fb(Array("<f4"))
    quanParameter: IDSTQuan | None = fb(Sub(IDSTQuan))
    symmetricQuan: QuantizedFloatParam | None = fb(Sub(QuantizedFloatParam))
    sparseParameter: SparseCommon | None = fb(Sub(SparseCommon))
    # quantized: [offset, weight_bytes, alpha_bytes, bias_bytes, sparse_index_bytes]
    # float (no quanParameter): [offset, weight_bytes, bias_bytes]
    external: list[int] | None = fb(IntList("<i8"))


@flat_table
class Axis:
    axis: int = fb(I32, 0)


@flat_table
class Input:
    dims: list[int] | None = fb(IntList())
    dtype: str = fb(DATA_TYPE, "DT_FLOAT")
    dformat: str = fb(DATA_FORMAT, "NC4HW4")


@flat_table
class Slice:
    axis: int = fb(I32, 0)
    slicePoints: list[int] | None = fb(IntList())
    sourceType: str = fb(ByteEnum(E.NET_SOURCE), "CAFFE")


@flat_table
class Scale:
    channels: int = fb(I32, 0)
    scaleData: np.ndarray | None = fb(Array("<f4"))
    biasData: np.ndarray | None = fb(Array("<f4"))
    external: list[int] | None = fb(IntList("<i8"))


@flat_table
class Eltwise:
    type: str = fb(ByteEnum(E.ELTWISE_TYPE), "PROD")
    coeff: np.ndarray | None = fb(Array("<f4"))


@flat_table
class Flatten:
    axis: int = fb(I32, 0)
    endAxis: int = fb(I32, 0)


@flat_table
class Permute:
    dims: list[int] | None = fb(IntList())


@flat_table
class Reshape:
    dims: list[int] | None = fb(IntList())
    dimType: str = fb(DATA_FORMAT, "NCHW")


@flat_table
class Relu:
    slope: float = fb(F32, 0.0)


@flat_table
class Relu6:
    minValue: float = fb(F32, 0.0)
    maxValue: float = fb(F32, 6.0)


# --- TensorflowOp.fbs -------------------------------------------------------------------

@flat_table
class BinaryOp:
    opType: str = fb(Enum(E.BINARY_OP), "ADD")
    T: str = fb(DATA_TYPE, "DT_FLOAT")
    activationType: int = fb(I32, 0)


@flat_table
class PackParam:
    dataType: str = fb(DATA_TYPE, "DT_INVALID")
    axis: int = fb(I32, 0)


@flat_table
class StridedSliceParam:
    Index: str = fb(DATA_TYPE, "DT_INVALID")
    T: str = fb(DATA_TYPE, "DT_INVALID")
    beginMask: int = fb(I32, 0)
    endMask: int = fb(I32, 0)
    ellipsisMask: int = fb(I32, 0)
    newAxisMask: int = fb(I32, 0)
    shrinkAxisMask: int = fb(I32, 0)
    fromType: int = fb(I32, 0)  # 0 TensorFlow semantics, 1 ONNX/Torch


@flat_table
class SqueezeParam:
    squeezeDims: list[int] | None = fb(IntList())


@flat_table
class CastParam:
    srcT: str = fb(DATA_TYPE, "DT_INVALID")
    dstT: str = fb(DATA_TYPE, "DT_INVALID")


@flat_table
class ReductionParam:
    operation: str = fb(ByteEnum(E.REDUCTION_TYPE), "SUM")
    dim: list[int] | None = fb(IntList())
    coeff: float = fb(F32, 0.0)
    keepDims: bool = fb(BOOL, False)
    dType: str = fb(DATA_TYPE, "DT_FLOAT")


@flat_table
class Gather:
    Tindices: str = fb(DATA_TYPE, "DT_INVALID")
    Tparams: str = fb(DATA_TYPE, "DT_INVALID")
    validateIndices: bool = fb(BOOL, False)
    axis: int = fb(I32, 0)


@flat_table
class ExpandDims:
    T: str = fb(DATA_TYPE, "DT_INVALID")
    Tdim: str = fb(DATA_TYPE, "DT_INVALID")
    axis: int = fb(I32, 0)


@flat_table
class UnaryOp:
    opType: str = fb(Enum(E.UNARY_OP), "ABS")
    T: str = fb(DATA_TYPE, "DT_INVALID")
    tableInt8: np.ndarray | None = fb(Array("i1"))


@flat_table
class TopKV2:
    T: str = fb(DATA_TYPE, "DT_FLOAT")
    sorted: bool = fb(BOOL, False)
    largest: bool = fb(BOOL, True)


@flat_table
class Fill:
    pass


@flat_table
class GatherV2:
    Taxis: str = fb(DATA_TYPE, "DT_INVALID")
    Tindices: str = fb(DATA_TYPE, "DT_INVALID")
    Tparams: str = fb(DATA_TYPE, "DT_INVALID")


@flat_table
class Range:
    Tidx: str = fb(DATA_TYPE, "DT_INVALID")


@flat_table
class Rank:
    pass


@flat_table
class Size:
    outputDataType: str = fb(DATA_TYPE, "DT_INVALID")


@flat_table
class Transpose:
    Tperm: str = fb(DATA_TYPE, "DT_INVALID")


@flat_table
class SliceTf:
    T: str = fb(DATA_TYPE, "DT_INVALID")


@flat_table
class MatMul:
    T: str = fb(DATA_TYPE, "DT_INVALID")
    transposeA: bool = fb(BOOL, False)
    transposeB: bool = fb(BOOL, False)
    weight: np.ndarray | None = fb(Array("<f4"))
    bias: np.ndarray | None = fb(Array("<f4"))


@flat_table
class MomentsParam:
    dim: list[int] | None = fb(IntList())
    keepDims: bool = fb(BOOL, True)
    dType: str = fb(DATA_TYPE, "DT_FLOAT")


@flat_table
class BatchMatMulParam:
    adjX: bool = fb(BOOL, False)
    adjY: bool = fb(BOOL, False)


@flat_table
class OneHotParam:
    dType: str = fb(DATA_TYPE, "DT_FLOAT")
    axis: int = fb(I32, -1)


@flat_table
class PadParam:
    mode: str = fb(ByteEnum({0: "CONSTANT", 1: "REFLECT", 2: "SYMMETRIC", 3: "EDGE"}), "CONSTANT")


@flat_table
class LayerNorm:
    axis: list[int] | None = fb(IntList())
    epsilon: float = fb(F32, 0.0)
    gamma: np.ndarray | None = fb(Array("<f4"))
    beta: np.ndarray | None = fb(Array("<f4"))
    group: int = fb(I32, 1)
    external: list[int] | None = fb(IntList("<i8"))  # [offset, gamma_bytes, beta_bytes]
    useRMSNorm: bool = fb(BOOL, False)


@flat_table
class GroupNorm:
    axis: int = fb(I32, 0)
    epsilon: float = fb(F32, 0.0)
    gamma: np.ndarray | None = fb(Array("<f4"))
    beta: np.ndarray | None = fb(Array("<f4"))
    group: int = fb(I32, 1)
    bSwish: int = fb(I32, 0)
    external: list[int] | None = fb(IntList("<i8"))


@flat_table
class CumSum:
    exclusive: bool = fb(BOOL, False)
    reverse: bool = fb(BOOL, False)


# --- UserDefine.fbs ---------------------------------------------------------------------

@flat_table
class TensorConvertInfo:
    source: str = fb(DATA_FORMAT, "NCHW")
    dest: str = fb(DATA_FORMAT, "NCHW")


# --- MNN.fbs ----------------------------------------------------------------------------

@flat_table
class Plugin:
    type: str | None = fb(String())
    attr: list[Attribute] | None = fb(SubList(Attribute))


@flat_table
class Extra:
    type: str | None = fb(String())
    engine: str | None = fb(String())
    info: np.ndarray | None = fb(Array("i1"))
    attr: list[Attribute] | None = fb(SubList(Attribute))
    vector: bool = fb(BOOL, False)


@flat_table
class AttentionParam:
    kv_cache: bool = fb(BOOL, True)
    kv_shared_layer: str | None = fb(String())
    layer_index: int = fb(I32, -1)
    kv_shared_layer_index: int = fb(I32, -1)
    mhq_quant: list | None = fb(Skip())
    output_c4: bool = fb(BOOL, False)
    attnScale: float = fb(F32, 0.0)  # 0 means 1/sqrt(head_dim)


@flat_table
class LinearAttentionParam:
    attn_type: str | None = fb(String())
    num_k_heads: int = fb(I32, 0)
    num_v_heads: int = fb(I32, 0)
    head_k_dim: int = fb(I32, 0)
    head_v_dim: int = fb(I32, 0)
    use_qk_l2norm: bool = fb(BOOL, False)
    gate_fold: bool = fb(BOOL, False)
    gate_coef: np.ndarray | None = fb(Array("<f4"))
    gate_bias: np.ndarray | None = fb(Array("<f4"))


@flat_table
class RoPEParam:
    rope_cut_head_dim: int = fb(I32, 0)
    num_head: int = fb(I32, 0)
    kv_num_head: int = fb(I32, 0)
    head_dim: int = fb(I32, 0)
    q_norm: LayerNorm | None = fb(Sub(LayerNorm))
    k_norm: LayerNorm | None = fb(Sub(LayerNorm))


@flat_table
class FusedLinearParam:
    """N 1x1 convolutions over one input: (gate, up) when act_silu_mul, else (q, k, v[, w])."""

    convs: list[Convolution2D] | None = fb(SubList(Convolution2D))
    act_silu_mul: bool = fb(BOOL, False)
    has_ln: bool = fb(BOOL, False)
    ln: LayerNorm | None = fb(Sub(LayerNorm))
    ln_fold: bool = fb(BOOL, False)


@flat_table
class FmhaV2Param:
    heads: int = fb(I32, 0)


@flat_table
class FmhcaParam:
    heads: int = fb(I32, 0)


@flat_table
class StftParam:
    n_fft: int = fb(I32, 0)
    hop_length: int = fb(I32, 0)
    abs: bool = fb(BOOL, True)


@flat_table
class ShapeParam:
    hasStart: bool = fb(BOOL, False)
    start: int = fb(I32, 0)
    hasEnd: bool = fb(BOOL, False)
    end: int = fb(I32, 0)


@flat_table
class TensorQuantInfo:
    scale: float = fb(F32, 0.0)
    zero: float = fb(F32, 0.0)
    min: float = fb(F32, -128.0)
    max: float = fb(F32, 127.0)
    type: str = fb(DATA_TYPE, "DT_INVALID")


@flat_table
class TensorDescribe:
    blob: Blob | None = fb(Sub(Blob))
    index: int = fb(I32, 0)
    name: str | None = fb(String())
    regions: list | None = fb(Skip())
    quantInfo: TensorQuantInfo | None = fb(Sub(TensorQuantInfo))


@flat_table
class ExtraInfo:
    buffer: np.ndarray | None = fb(Array("i1"))
    name: str | None = fb(String())
    version: str | None = fb(String())


PARAM_TABLES: dict[str, type] = {cls.__name__: cls for cls in (
    Blob, Convolution2D, Pool, Axis, Input, Slice, Scale, Eltwise, Flatten, Permute, Reshape, Relu, Relu6,
    BinaryOp, PackParam, StridedSliceParam, SqueezeParam, CastParam, ReductionParam, Gather, ExpandDims,
    UnaryOp, TopKV2, Fill, GatherV2, Range, Rank, Size, Transpose, SliceTf, MatMul, MomentsParam,
    BatchMatMulParam, OneHotParam, PadParam, LayerNorm, GroupNorm, CumSum, TensorConvertInfo, Plugin,
    Extra, AttentionParam, LinearAttentionParam, RoPEParam, FusedLinearParam, FmhaV2Param, FmhcaParam, StftParam,
    ShapeParam,
)}
