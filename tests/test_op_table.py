"""The op table (mnngpu/ops/op_table.py) agrees with what reads it: every op a graph may name runs on
the CPU backup or is folded on the host, every backend's executions are table entries, and
every host rule matches the shape rule."""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu.backend import REGISTRY, Node, Tensor, backend_class, registry
from mnngpu.errors import BackendUnavailableError, ModelFormatError
from mnngpu.format import params as P
from mnngpu.format.enums import OP_TYPE
from mnngpu.ops import op_table
from mnngpu.runtime.validate import runnable_op_types


def test_every_graph_op_type_runs_on_the_cpu_or_is_always_folded():
    cpu = backend_class("cpu").executions
    for name in op_table.graph_op_types():
        assert name in cpu or op_table.OPS[name].shape_only or op_table.OPS[name].runs_as in cpu, name


def test_graph_op_types_are_mnn_op_types_and_fused_ones_are_not():
    mnn = set(OP_TYPE.values())
    assert op_table.graph_op_types() <= mnn
    fused = set(op_table.OPS) - op_table.graph_op_types()
    assert fused == {op_table.LINEAR_GROUP, op_table.GATED_LINEAR, op_table.ROPE, op_table.EXPERT_ADD,
                     op_table.SPARSE_MOE}
    assert not fused & mnn and all(name.startswith(op_table.FUSED_PREFIX) for name in fused)
    assert runnable_op_types() == set(op_table.graph_op_types()) | {"Input", "Const"}


@pytest.mark.parametrize("backend_type", list(REGISTRY))
def test_each_backend_table_names_only_table_ops(backend_type):
    try:
        executions = backend_class(backend_type).executions
    except BackendUnavailableError as exc:
        pytest.skip(f"{backend_type} unavailable: {exc}")
    assert set(executions) <= set(op_table.OPS)
    assert all(backend_type in registry.implemented_by(name) for name in executions)


def test_host_rules_agree_with_shape_rules():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    cases = [Node("Shape", "s"), Node("UnaryOp", "u", P.UnaryOp(opType="NEG")),
             Node("Squeeze", "q", P.SqueezeParam(squeezeDims=[])), Node("Cast", "c", P.CastParam(dstT="DT_INT32")),
             Node("Concat", "k", P.Axis(axis=1))]
    for node in cases:
        inputs = [x, x] if node.type == "Concat" else [x]
        tensors = [Tensor(a.shape, a.dtype, host=a) for a in inputs]
        (value,) = op_table.evaluate(node, inputs)
        ((shape, dtype),) = op_table.infer(node, tensors)
        assert value.shape == tuple(shape) and value.dtype == np.dtype(dtype), node.type


@pytest.mark.parametrize("dims, value", [([2, 3], np.float32(1.5)), ([4], np.int32(-7)), ([], np.float32(2)),
                                         ([2, 0, 3], np.float32(1))])
def test_fill_is_np_full_of_its_value(dims, value):
    node, shape_input = Node("Fill", "f"), np.array(dims, dtype=np.int32)
    (got,) = op_table.evaluate(node, [shape_input, np.array([value])])
    want = np.full(dims, value)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    tensors = [Tensor(shape_input.shape, shape_input.dtype, host=shape_input), Tensor((), np.dtype(want.dtype))]
    assert op_table.infer(node, tensors) == [(want.shape, want.dtype)]


def test_fill_needs_a_known_1d_shape_and_one_value():
    node = Node("Fill", "f")
    one = Tensor((), np.dtype(np.float32))
    with pytest.raises(ModelFormatError, match="must be known before the op runs"):
        op_table.infer(node, [Tensor((2,), np.dtype(np.int32)), one])
    with pytest.raises(ModelFormatError, match="a Fill of a 1-D shape"):
        op_table.infer(node, [Tensor((1, 2), np.dtype(np.int32), host=np.ones((1, 2), np.int32)), one])
    with pytest.raises(ModelFormatError, match="a Fill of a 1-D shape"):
        op_table.evaluate(node, [np.array([2], np.int32), np.zeros(2, np.float32)])
    with pytest.raises(ModelFormatError, match="a Fill of a 1-D shape"):
        op_table.evaluate(node, [np.array([-1], np.int32), np.zeros(1, np.float32)])


def test_an_op_outside_the_table_is_named():
    with pytest.raises(ModelFormatError, match="op type FmhaV2 is not supported"):
        op_table.infer(Node("FmhaV2", "fmha"), [Tensor((1, 4), np.dtype(np.float32))])
    with pytest.raises(ModelFormatError, match="cannot be evaluated on the host"):
        op_table.evaluate(Node("Attention", "a"), [])


SLICE_X = np.arange(2 * 3 * 10, dtype=np.float32).reshape(2, 3, 10)


@pytest.mark.parametrize("table, extra, want", [
    # torch.split with a lengths input (Qwen3.5's query and gate halves)
    (P.Slice(axis=-1, sourceType="TORCH"), [np.array([3, 7], np.int32)], [SLICE_X[..., :3], SLICE_X[..., 3:]]),
    # one length left to the rest
    (P.Slice(axis=2, sourceType="TORCH", slicePoints=[2, -1, 3]), [],
     [SLICE_X[..., :2], SLICE_X[..., 2:7], SLICE_X[..., 7:]]),
    # lengths that stop short of the axis' end
    (P.Slice(axis=2, sourceType="TENSORFLOW", slicePoints=[4, 4]), [], [SLICE_X[..., :4], SLICE_X[..., 4:8]]),
    # a single TORCH point is the piece length, a single TF point the piece count
    (P.Slice(axis=2, sourceType="TORCH", slicePoints=[5]), [], [SLICE_X[..., :5], SLICE_X[..., 5:]]),
    (P.Slice(axis=1, sourceType="TENSORFLOW", slicePoints=[3]), [], [SLICE_X[:, i:i + 1] for i in range(3)]),
    # Caffe's points are cut positions
    (P.Slice(axis=1, sourceType="CAFFE", slicePoints=[1]), [], [SLICE_X[:, :1], SLICE_X[:, 1:]]),
])
def test_slice_cuts_pieces_like_numpy_indexing(table, extra, want):
    node = Node("Slice", "s", table)
    got = op_table.evaluate(node, [SLICE_X, *extra])
    assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))
    tensors = [Tensor(a.shape, a.dtype, host=a) for a in (SLICE_X, *extra)]
    assert op_table.infer(node, tensors) == [(w.shape, w.dtype) for w in want]


def test_slice_lengths_that_do_not_fit_are_named():
    with pytest.raises(ModelFormatError, match="piece lengths that fit"):
        op_table.evaluate(Node("Slice", "s", P.Slice(axis=2, sourceType="TORCH")), [SLICE_X, np.array([6, 6])])
    with pytest.raises(ModelFormatError, match="equal split"):
        op_table.evaluate(Node("Slice", "s", P.Slice(axis=2, sourceType="TENSORFLOW")), [SLICE_X])
