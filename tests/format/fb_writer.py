"""A small hand-written .mnn writer (flatbuffers.Builder), for tables MNN 3.6.1's converter
cannot write (FusedLinearParam, GatedRMSNorm) and for buffers no converter would write.

Field numbers are MNN.fbs's schema indices (the Builder turns index i into vtable slot 4+2i).
OpType / OpParameter codes are passed in as numbers, so a test can also write unknown ones.
"""

from __future__ import annotations

import flatbuffers
import numpy as np

OP_TYPE = {"Input": 34, "Convolution": 12, "LayerNorm": 603, "FusedLinear": 307, "GatedRMSNorm": 308}
# LayerNorm and RoPEParam (102) are checked against mnnconvert in test_graph_reader; FusedLinearParam
# is the member after RoPEParam, added after MNN 3.6.1.
OP_PARAMETER = {"Convolution2D": 9, "Input": 21, "LayerNorm": 88, "FusedLinearParam": 103}


def _table(b: flatbuffers.Builder, n_fields: int, fields: list) -> int:
    """fields: (kind, index, value) with kind 'offset', 'int32', 'bool', 'uint8', 'float32'."""
    b.StartObject(n_fields)
    for kind, index, value in fields:
        if kind == "offset":
            b.PrependUOffsetTRelativeSlot(index, value, 0)
        elif kind == "int32":
            b.PrependInt32Slot(index, value, -(2**31))
        elif kind == "bool":
            b.PrependBoolSlot(index, value, not value)
        elif kind == "uint8":
            b.PrependUint8Slot(index, value, 255)
        elif kind == "float32":
            b.PrependFloat32Slot(index, value, float("nan"))
    return b.EndObject()


def _offsets(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _strings(b: flatbuffers.Builder, values: list[str]) -> int:
    return _offsets(b, [b.CreateString(v) for v in values])


def layernorm(b, gamma: list[float], epsilon: float, rms: bool, external: list[int] | None = None) -> int:
    gamma_vec = b.CreateNumpyVector(np.array(gamma, dtype="<f4"))
    ext_vec = b.CreateNumpyVector(np.array(external, dtype="<i8")) if external else None
    fields = [("offset", 2, gamma_vec), ("float32", 1, epsilon), ("bool", 6, rms)]
    if ext_vec is not None:
        fields.append(("offset", 5, ext_vec))
    return _table(b, 7, fields)


def conv2d(b, oc: int, ic: int, weight: list[float] | None = None, external: list[int] | None = None) -> int:
    common = _table(b, 17, [("int32", 10, oc), ("int32", 11, ic)])
    fields = [("offset", 0, common)]
    if weight is not None:
        fields.append(("offset", 1, b.CreateNumpyVector(np.array(weight, dtype="<f4"))))
    if external is not None:
        fields.append(("offset", 6, b.CreateNumpyVector(np.array(external, dtype="<i8"))))
    return _table(b, 7, fields)


def fused_linear(b, convs: list[int], act_silu_mul: bool, ln: int | None) -> int:
    fields = [("offset", 0, _offsets(b, convs)), ("bool", 1, act_silu_mul)]
    if ln is not None:
        fields += [("bool", 2, True), ("offset", 3, ln)]
    return _table(b, 5, fields)


def op(b, name: str, op_type: int, param_type: int, param: int | None, inputs: list[int],
       outputs: list[int]) -> int:
    fields = [("offset", 3, b.CreateString(name)), ("int32", 5, op_type),
              ("offset", 0, b.CreateNumpyVector(np.array(inputs, dtype="<i4"))),
              ("offset", 4, b.CreateNumpyVector(np.array(outputs, dtype="<i4")))]
    if param is not None:
        fields += [("uint8", 1, param_type), ("offset", 2, param)]
    return _table(b, 8, fields)


def subgraph(b, name: str, tensor_names: list[str], nodes: list[int], inputs: list[int], outputs: list[int]) -> int:
    return _table(b, 6, [("offset", 0, b.CreateString(name)),
                         ("offset", 1, b.CreateNumpyVector(np.array(inputs, dtype="<i4"))),
                         ("offset", 2, b.CreateNumpyVector(np.array(outputs, dtype="<i4"))),
                         ("offset", 3, _strings(b, tensor_names)), ("offset", 4, _offsets(b, nodes))])


def net(b, ops: list[int], tensor_names: list[str], output_names: list[str], subgraphs: list[int] = ()) -> bytes:
    fields = [("offset", 3, _offsets(b, ops)), ("offset", 7, _strings(b, tensor_names)),
              ("offset", 4, _strings(b, output_names))]
    if subgraphs:
        fields.append(("offset", 10, _offsets(b, list(subgraphs))))
    b.Finish(_table(b, 12, fields))
    return bytes(b.Output())
