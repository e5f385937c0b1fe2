"""The CPU backend folds each decoder norm into the int4 linear layer after it (backends/cpu/ops/
norm.py: fold_norms): the residual add, the RMSNorm and the quantization of x in one launch. The truth
is the same engine with the fold off, which the conformance suite holds to MNN: the logits of a
prefill and of every decode step must be bit-identical, and the norms must really have been folded."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import mnngpu.backends.cpu as cpu_backend
from mnngpu import llm as mnngpu_llm
from mnngpu.backends.cpu.ops.linear import CPULinear
from mnngpu.backends.cpu.ops.norm import CPULayerNorm
from tests.conftest import FIXTURES

# a plain decoder, a C4 export (FusedLinear has_ln), sandwich norms (gemma3), recurrent layers with
# gated norms (qwen3_5, lfm2) and a MoE whose experts read the norm through the router
MODELS = ["qwen2_int4_b64", "qwen3_c4", "gemma3_mix_int4", "qwen3_5_c4", "lfm2_int4_b64", "qwen3_moe_int4_b64"]
PROMPT = [5, 9, 14, 3, 27, 8, 11]
STEPS = 4


def logits_and_folds(name: str, fold: bool, monkeypatch) -> tuple[list[np.ndarray], list[int]]:
    folds: list[int] = []
    real = cpu_backend.fold_norms

    def counted(executions):
        folds.append(real(executions) if fold else 0)
        return folds[-1]

    monkeypatch.setattr(cpu_backend, "fold_norms", counted)
    model = mnngpu_llm.create(FIXTURES / name)
    model.set_config({"backend_type": "cpu", "precision": "low", "memory": "low", "thread_num": 2})
    model.load()
    rows = [np.array(model.forward(PROMPT))[0, -1]]
    for _ in range(STEPS):
        rows.append(np.array(model.forward([int(np.argmax(rows[-1]))]))[0, -1])
    return rows, folds


@pytest.mark.parametrize("name", MODELS)
def test_folded_norms_give_the_unfolded_logits_bit_for_bit(name, monkeypatch):
    folded, folds = logits_and_folds(name, True, monkeypatch)
    plain, _ = logits_and_folds(name, False, monkeypatch)
    assert len(folds) >= 2 and all(count > 0 for count in folds), folds   # the prefill and the decode module
    for step, (got, want) in enumerate(zip(folded, plain)):
        assert np.array_equal(got, want), f"step {step}: {np.abs(got - want).max()}"


def test_a_folded_norm_step_does_nothing_and_a_broadcast_add_is_not_folded():
    """fold_norms takes a norm only where its output buffer is exactly the next linear's x and its
    addends are whole rows; the folded norm's own step then leaves its outputs alone."""
    from mnngpu.backends.cpu.ops.norm import _norm_args

    norm = CPULayerNorm.__new__(CPULayerNorm)
    out = np.zeros((1, 8), np.float32)
    sums = np.zeros((1, 8), np.float32)
    norm.folded = False
    norm.gamma, norm.beta, norm.eps, norm.rms = np.ones(8, np.float32), np.zeros(0, np.float32), 1e-6, True
    norm.args = (sums, norm.gamma, norm.beta, norm.eps, norm.rms, out)
    linear = CPULinear.__new__(CPULinear)   # the parts of a lane-packed one that _norm_args reads
    linear.weights, linear.kernel_name = [SimpleNamespace(lanes=True)], "lanes_group"
    call = (None,) * 5 + (out,)
    linear.gemv_calls = [call]
    norm.addends = (np.ones((1, 8), np.float32), np.ones((1, 8), np.float32))
    assert _norm_args(norm, linear) is not None
    norm.addends = (np.ones((1, 8), np.float32), np.ones((1, 1), np.float32))   # broadcast: the norm's own
    assert _norm_args(norm, linear) is None
    linear.gemv_calls = [(None,) * 5 + (np.zeros((1, 8), np.float32),)]   # another buffer
    norm.addends = None
    assert _norm_args(norm, linear) is None
    norm.folded = True
    norm.onExecute([], [])
    assert not out.any()
