"""MNN's newer export format (C4 graphs: FusedLinear, RoPE, GatedRMSNorm, LinearAttention with
gate_fold), beyond what test_fixture_models checks against the newer runtime's recordings:

* every field of the new tables that changes the math is read: a model with the field changed
  either computes other logits or is refused with an error naming the op;
* damaged tables (projections that disagree, head counts that contradict the projections, an
  unknown variant) give one ModelFormatError naming the op;
* an old export and a C4 export of the same weights run through the same engine nodes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from mnngpu.errors import ModelFormatError
from mnngpu.format import read_net
from mnngpu.runtime import validate
from mnngpu.runtime.c4_ops import rewrite_exported_fusions
from tests.conftest import FIXTURES, reference

QWEN3 = "qwen3_c4"           # FusedLinear (qkv, qkv with has_ln, gate/up with has_ln), RoPE with q/k norm
QWEN3_5 = "qwen3_5_c4"       # the four-way FusedLinear, LinearAttention with gate_fold, GatedRMSNorm
PHI2 = "phi2_c4"             # RoPE rotating 16 of 32 dims


def _ops(net, op_type):
    return [op for op in net.ops if op.type == op_type]


def _changed(net, op_type: str, change, index: int = 0):
    """`net` with op `index` of `op_type` given the param change(param) returns."""
    op = _ops(net, op_type)[index]
    ops = [dataclasses.replace(o, param=change(o.param)) if o is op else o for o in net.ops]
    return dataclasses.replace(net, ops=ops), op.name


def _prefill_logits(name: str, monkeypatch, net=None) -> np.ndarray:
    if net is not None:
        monkeypatch.setattr(validate, "read_net", lambda path: net)
    model = mnngpu_llm.create(FIXTURES / name)
    model.set_config({"backend_type": "cpu", "precision": "high", "thread_num": 2})
    model.load()
    return np.asarray(model.forward(reference(name)[0]["prompts"][1]["ids"]))[0, -1]


def _with_norm(norm, **fields):
    return dataclasses.replace(norm, **fields)


# each: (fixture, op type, which op, the change) -- every one alters what MNN's runtime computes
MATH_FIELDS = {
    "RoPEParam.rope_cut_head_dim": (QWEN3, "RoPE", 0, lambda p: dataclasses.replace(p, rope_cut_head_dim=16)),
    "RoPEParam.q_norm": (QWEN3, "RoPE", 0, lambda p: dataclasses.replace(p, q_norm=None)),
    "RoPEParam.k_norm": (QWEN3, "RoPE", 1, lambda p: dataclasses.replace(p, k_norm=None)),
    "RoPEParam.q_norm.epsilon": (QWEN3, "RoPE", 0, lambda p: dataclasses.replace(
        p, q_norm=_with_norm(p.q_norm, epsilon=1.0))),
    "FusedLinearParam.convs (order)": (QWEN3, "FusedLinear", 0, lambda p: dataclasses.replace(
        p, convs=[p.convs[0], p.convs[2], p.convs[1]])),
    "FusedLinearParam.ln": (QWEN3, "FusedLinear", 1, lambda p: dataclasses.replace(
        p, ln=_with_norm(p.ln, epsilon=1.0))),
    "GatedRMSNorm LayerNorm.epsilon": (QWEN3_5, "GatedRMSNorm", 0, lambda p: dataclasses.replace(p, epsilon=1.0)),
    "LinearAttentionParam.gate_coef": (QWEN3_5, "LinearAttention", 0, lambda p: dataclasses.replace(
        p, gate_coef=p.gate_coef * 4)),
    "LinearAttentionParam.gate_bias": (QWEN3_5, "LinearAttention", 0, lambda p: dataclasses.replace(
        p, gate_bias=p.gate_bias + 1)),
    "LinearAttentionParam.gate_fold": (QWEN3_5, "LinearAttention", 0, lambda p: dataclasses.replace(
        p, gate_fold=False)),
    "AttentionParam.attnScale": (QWEN3, "Attention", 0, lambda p: dataclasses.replace(p, attnScale=0.5)),
}


@pytest.mark.parametrize("field", sorted(MATH_FIELDS))
def test_every_field_that_changes_the_math_is_read(field, monkeypatch):
    name, op_type, index, change = MATH_FIELDS[field]
    before = _prefill_logits(name, monkeypatch)
    net, op_name = _changed(validate.needed_ops(read_net(FIXTURES / name / "llm.mnn")), op_type, change, index)
    try:
        after = _prefill_logits(name, monkeypatch, net)
    except ModelFormatError as error:
        assert op_name in str(error), error
        return
    assert np.abs(after - before).max() > 1e-3 * before.std(), field


def test_ln_fold_is_a_converter_license_only(monkeypatch):
    """ln_fold lets MNN's converter fold a norm into the op (has_ln); the op computes the same without it."""
    before = _prefill_logits(QWEN3, monkeypatch)
    net, _ = _changed(read_net(FIXTURES / QWEN3 / "llm.mnn"), "FusedLinear", lambda p: dataclasses.replace(
        p, ln_fold=not p.ln_fold))
    np.testing.assert_array_equal(_prefill_logits(QWEN3, monkeypatch, net), before)


DAMAGED = {
    "projections of different input widths": ("FusedLinear", 0, lambda p: dataclasses.replace(p, convs=[
        p.convs[0], dataclasses.replace(p.convs[1], common=dataclasses.replace(p.convs[1].common, inputCount=7)),
        p.convs[2]]), "input widths"),
    "gate/up with three projections": ("FusedLinear", 0, lambda p: dataclasses.replace(p, act_silu_mul=True),
                                       "gate and up"),
    "has_ln without its norm": ("FusedLinear", 1, lambda p: dataclasses.replace(p, ln=None), "has_ln"),
    "has_ln on one input": ("FusedLinear", 0, lambda p: dataclasses.replace(p, has_ln=True, ln=None),
                            "has_ln"),
    "num_head against the q projection": ("RoPE", 0, lambda p: dataclasses.replace(p, num_head=p.num_head + 1),
                                          "num_head"),
    "head_dim odd": ("RoPE", 0, lambda p: dataclasses.replace(p, head_dim=33), "even head_dim"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_table_is_one_error_naming_the_op(case):
    op_type, index, change, wording = DAMAGED[case]
    net, op_name = _changed(read_net(FIXTURES / QWEN3 / "llm.mnn"), op_type, change, index)
    with pytest.raises(ModelFormatError, match=wording) as error:
        rewrite_exported_fusions(net)
    assert op_name in str(error.value)


def test_gate_fold_with_short_vectors_is_refused_naming_the_field():
    net, op_name = _changed(read_net(FIXTURES / QWEN3_5 / "llm.mnn"), "LinearAttention",
                            lambda p: dataclasses.replace(p, gate_coef=p.gate_coef[:1]))
    with pytest.raises(ModelFormatError, match="gate_coef") as error:
        rewrite_exported_fusions(net)
    assert op_name in str(error.value)


@pytest.mark.parametrize("new, old", [(QWEN3, "qwen3_int4_b64"), (QWEN3_5, "qwen3_5_int4_b64"), (PHI2, "phi2_int8")])
def test_old_and_c4_exports_run_the_same_engine_nodes(new, old):
    """The decoder layer of a C4 export and of an old export of the same weights become the same
    fused nodes on the CPU (whose table has them all), the residual adds folded into the norms after
    them alike: one path to make fast."""
    counts = {}
    for name in (new, old):
        model = mnngpu_llm.create(FIXTURES / name)
        model.set_config({"backend_type": "cpu", "thread_num": 2})
        model.load()
        ops = model.pool.select(1, False).pipeline_module.static_module.ops
        kinds = [op.node.type for op in ops if op.node.type.startswith("fused.")
                 or op.node.type in ("Attention", "LinearAttention")]
        residual_norms = sum(op.node.type == "LayerNorm" and len(op.inputs) == 2 for op in ops)
        counts[name] = (sorted(set(kinds)), residual_norms)
    assert counts[new] == counts[old], counts
