"""Reading llm.mnn: the root `Net` table, its ops and its subgraphs.

Field indices (schema order in MNN.fbs; vtable slot = 4 + 2*index):
  Net: 0 bizCode, 1 extraTensorDescribe, 2 extraInfo, 3 oplists, 4 outputName,
       5 preferForwardType, 6 sourceType, 7 tensorName, 8 tensorNumber, 9 usage,
       10 subgraphs, 11 mnn_uuid
  Op:  0 inputIndexes, 1 main_type, 2 main (the OpParameter union), 3 name,
       4 outputIndexes, 5 type, 6 defaultDimentionFormat, 7 externalPath
  SubGraphProto: 0 name, 1 inputs, 2 outputs, 3 tensors, 4 nodes, 5 extraTensorDescribe
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flatbuffers import number_types as N

from ..errors import ModelFormatError
from . import enums as E
from .flatbuf import FlatBuffer, TableView
from .params import PARAM_TABLES, ExtraInfo, TensorDescribe, UnknownParam
from .schema import decode_table


@dataclass
class Op:
    type: str  # OpType NAME: "Convolution", "BinaryOp", "Input", "Const", ...
    name: str
    inputs: list[int]
    outputs: list[int]
    param_type: str  # OpParameter member NAME: "Convolution2D", "Blob", ... or "NONE"
    param: Any  # a dataclass from params.py, UnknownParam, or None
    default_format: str = "NHWC"
    external_path: str | None = None


@dataclass
class SubGraph:
    name: str
    inputs: list[int]
    outputs: list[int]
    tensor_names: list[str]
    ops: list[Op]


@dataclass
class Net:
    ops: list[Op]
    tensor_names: list[str]
    output_names: list[str]
    subgraphs: list[SubGraph] = field(default_factory=list)
    version: str = ""  # extraInfo.version: the MNN version that wrote the file
    usage: str = "INFERENCE"
    biz_code: str = ""
    source_type: str = "CAFFE"
    tensor_number: int = 0
    extra_tensor_describe: list[TensorDescribe] = field(default_factory=list)
    path: str = ""


def read_net(path: str | os.PathLike) -> Net:
    """Parse and verify an .mnn graph file; raises ModelFormatError on any malformed buffer."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ModelFormatError(f"a readable .mnn file ({err.strerror})", path=path) from None
    return parse_net(data, path)


def parse_net(data: bytes, path: str | os.PathLike = "<memory>") -> Net:
    """Parse and verify an .mnn graph held in memory."""
    buffer = FlatBuffer(bytes(data), path)
    try:
        root = buffer.root("Net")
    except ModelFormatError as exc:  # no root table: not a damaged model, not a model at all
        detail = str(exc).removeprefix(f"{exc.path}: {exc.field}: ")
        raise ModelFormatError(f"not an MNN model file ({detail})", path=path, field=exc.field) from None
    tensor_names = root.strings(7, "tensorName") or []
    ops = _read_ops(root, 3, "oplists", tensor_names)
    extra_info = root.table(2, "extraInfo")
    version = decode_table(extra_info, ExtraInfo).version if extra_info is not None else None
    return Net(
        ops=ops,
        tensor_names=tensor_names,
        output_names=root.strings(4, "outputName") or [],
        subgraphs=[_read_subgraph(view) for view in root.tables(10, "subgraphs") or []],
        version=version or "",
        usage=E.enum_name(E.USAGE, root.scalar(9, N.Int8Flags, 0, "usage")),
        biz_code=root.string(0, "bizCode") or "",
        source_type=E.enum_name(E.NET_SOURCE, root.scalar(6, N.Int8Flags, 0, "sourceType")),
        tensor_number=root.scalar(8, N.Int32Flags, 0, "tensorNumber"),
        extra_tensor_describe=[decode_table(v, TensorDescribe) for v in root.tables(1, "extraTensorDescribe") or []],
        path=str(path),
    )


def _read_subgraph(view: TableView) -> SubGraph:
    tensor_names = view.strings(3, "tensors") or []
    inputs = _indices(view, 1, "inputs", len(tensor_names))
    outputs = _indices(view, 2, "outputs", len(tensor_names))
    return SubGraph(name=view.string(0, "name") or "", inputs=inputs, outputs=outputs,
                    tensor_names=tensor_names, ops=_read_ops(view, 4, "nodes", tensor_names))


def _read_ops(owner: TableView, index: int, name: str, tensor_names: list[str]) -> list[Op]:
    return [_read_op(view, len(tensor_names)) for view in owner.tables(index, name) or []]


def _read_op(view: TableView, n_tensors: int) -> Op:
    code, main = view.union(1, 2, "main")
    param_type = E.enum_name(E.OP_PARAMETER, code)
    return Op(
        type=E.enum_name(E.OP_TYPE, view.scalar(5, N.Int32Flags, 0, "type")),
        name=view.string(3, "name") or "",
        inputs=_indices(view, 0, "inputIndexes", n_tensors),
        outputs=_indices(view, 4, "outputIndexes", n_tensors),
        param_type=param_type,
        param=_read_param(param_type, main),
        default_format=E.enum_name(E.DATA_FORMAT, view.scalar(6, N.Int8Flags, 1, "defaultDimentionFormat")),
        external_path=view.string(7, "externalPath"),
    )


def _read_param(param_type: str, main: TableView | None):
    if main is None:
        return None
    cls = PARAM_TABLES.get(param_type)
    if cls is None:
        return UnknownParam(param_type)
    return decode_table(main, cls)


def _indices(view: TableView, index: int, name: str, n_tensors: int) -> list[int]:
    values = view.array(index, "<i4", name)
    if values is None:
        return []
    found = values.tolist()
    for i, tensor in enumerate(found):
        if not 0 <= tensor < n_tensors:
            raise view.fb.error(f"a tensor index in [0, {n_tensors}), got {tensor}", f"{view.where}.{name}[{i}]")
    return found
