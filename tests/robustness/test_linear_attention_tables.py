"""An LFM2 export whose LinearAttention table disagrees with itself or with its conv_weight: one
ModelFormatError at load naming llm.mnn, the op and the field, and the folder left untouched."""

from __future__ import annotations

import struct

import pytest

from mnngpu.errors import ModelFormatError
from tests.robustness.folders import (
    _u32,
    field_position,
    first_failure,
    first_op_of_type,
    model_copy,
    untouched,
)

MODEL = "lfm2_int4_b64"
LINEAR_ATTENTION = 305           # OpType.LinearAttention
OP_MAIN = 2                      # Op field 2: main, the parameter table
FIELDS = {"num_k_heads": 1, "num_v_heads": 2, "head_k_dim": 3, "head_v_dim": 4}   # LinearAttentionParam
WHERE = "oplists[37] (/layers.0/self_attn/FusedLinearAttention)"


def set_table_field(folder, name: str, value: int) -> None:
    """Overwrite an int32 field of the first LinearAttention op's table in llm.mnn."""
    path = folder / "llm.mnn"
    data = bytearray(path.read_bytes())
    main = field_position(data, first_op_of_type(data, LINEAR_ATTENTION), OP_MAIN)
    table = main + _u32(data, main)
    struct.pack_into("<i", data, field_position(data, table, FIELDS[name]), value)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name, value, field, words", [
    ("head_v_dim", 64, "head_v_dim", "conv_weight"),     # the conv_weight's rows no longer agree
    ("num_v_heads", 2, "head_v_dim", "conv_weight"),
    ("head_v_dim", 0, "head_v_dim", "positive"),
])
def test_inconsistent_head_dims_name_the_op_and_the_field(tmp_path, name, value, field, words):
    folder = model_copy(tmp_path, MODEL)
    set_table_field(folder, name, value)
    with untouched(folder):
        stage, error = first_failure(folder)
    assert stage == "load" and isinstance(error, ModelFormatError)
    assert error.path == str(folder / "llm.mnn") and error.field == f"{WHERE}.{field}"
    assert words in str(error)
