"""MNN's own RoPE op (type 306, MNN's newer export format) is not the engine's fused rotate-half
node: it is rewritten at load (runtime/c4_ops.py) into one, and validate holds it to its table."""

from __future__ import annotations

import flatbuffers
import pytest

from mnngpu.errors import ModelFormatError
from mnngpu.format import parse_net
from mnngpu.format.enums import OP_TYPE
from mnngpu.runtime import fusion
from mnngpu.runtime.validate import check_graph, runnable_op_types
from tests.format import fb_writer as fbw

ROPE_TYPE = next(code for code, name in OP_TYPE.items() if name == "RoPE")


def test_mnns_rope_op_without_its_table_is_rejected_by_validate():
    b = flatbuffers.Builder(0)
    rope = fbw.op(b, "rope", ROPE_TYPE, 0, None, [], [0])
    net = parse_net(fbw.net(b, [rope], ["q"], ["q"]))
    assert net.ops[0].type == "RoPE"
    with pytest.raises(ModelFormatError, match=r"oplists\[0\] \(rope\): expected a RoPEParam parameter table for a "
                                               r"RoPE op, got NONE$"):
        check_graph(net)


def test_fused_node_names_are_no_mnn_op_type():
    fused = {fusion.LINEAR_GROUP, fusion.GATED_LINEAR, fusion.ROPE}
    assert not fused & set(OP_TYPE.values())
    assert not fused & runnable_op_types()
