"""The conformance checks find faults that tiny fixtures and argmax-only comparisons let through.

Each test first runs a check on an unbroken model (it passes), then breaks a CPU kernel on purpose and
expects the very same check (tests/conformance/checks.py, what test_fixture_models.py and
test_real_widths.py run) to fail, naming the step or row:
* an error of 0.05 x the logits' std in decode step 3 only (the lm_head's runner-up logit lowered, so
  every greedy token stays the same);
* a wrong row 5 of an all_logits prefill (the last row, which the last-row check reads, is right);
* attention that is wrong only for heads of 128 (the tiny fixtures' heads of 32 are untouched).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conformance import checks
from tests.conftest import FIXTURES, reference

FAULT_STD = 0.05
STEP_FIXTURE = "qwen3_c4"    # records every step's top logits and one prompt's all_logits rows
FAULTY_STEP, FAULTY_ROW = 3, 5


def lower_runner_up(row: np.ndarray) -> None:
    """Lower a row's second-largest logit by FAULT_STD x the row's std: the argmax stays put."""
    row[np.argsort(row)[-2]] -= FAULT_STD * row.std()


@pytest.fixture
def broken_lm_head(monkeypatch):
    """Patches the CPU Linear kernel where it computes the logits (vocab output channels); returns
    a function that arms it with `fault(rows, past)`, which may change the rows [n, vocab] in place
    (past: the tokens in the cache before this forward)."""
    from mnngpu.backends.cpu.ops.linear import CPULinear

    original = CPULinear.onExecute
    armed = {}

    def broken(self, inputs, outputs):
        original(self, inputs, outputs)
        if "fault" in armed and outputs[0].shape[1] == armed["vocab"]:
            rows = outputs[0].device.reshape(-1, armed["vocab"])
            armed["fault"](rows, self.backend.kv_meta.kept)

    monkeypatch.setattr(CPULinear, "onExecute", broken)

    def arm(vocab: int, fault) -> None:
        armed.update(vocab=vocab, fault=fault)

    return arm


def test_an_error_in_decode_step_3_alone_fails_the_every_step_check(broken_lm_head):
    ref, first_logits = reference(STEP_FIXTURE)
    prompt = ref["prompts"][1]
    model = checks.load(FIXTURES / STEP_FIXTURE, "cpu")
    checks.check_every_step(model, prompt)
    decode = {"step": 0}

    def at_step_3(rows, past):
        decode["step"] = 0 if past == 0 else decode["step"] + 1
        if decode["step"] == FAULTY_STEP:
            lower_runner_up(rows[-1])

    broken_lm_head(first_logits.shape[1], at_step_3)
    with pytest.raises(AssertionError, match=f"step {FAULTY_STEP}: logits differ"):
        checks.check_every_step(model, prompt)
    # what the argmax-only comparison of later steps cannot see: every greedy token is still MNN's
    checks.check_greedy_and_first_logits(model, prompt, first_logits[1])


def test_a_wrong_all_logits_row_5_fails_the_every_row_check(broken_lm_head):
    ref, first_logits = reference(STEP_FIXTURE)
    prompt = next(p for p in ref["prompts"] if "rows_top" in p)
    model = checks.load(FIXTURES / STEP_FIXTURE, "cpu", all_logits=True)
    checks.check_every_row(checks.all_logits_rows(model, prompt["ids"]), prompt)

    def row_5(rows, past):
        if rows.shape[0] > FAULTY_ROW:
            lower_runner_up(rows[FAULTY_ROW])

    broken_lm_head(first_logits.shape[1], row_5)
    rows = checks.all_logits_rows(model, prompt["ids"])
    with pytest.raises(AssertionError, match=f"all_logits row {FAULTY_ROW}: logits differ"):
        checks.check_every_row(rows, prompt)
    # the last row, all the last-row check compares, is still MNN's
    k = ref["prompts"].index(prompt)
    checks.check_first_logits(rows[-1], first_logits[k], "last row")


@pytest.fixture
def broken_wide_attention(monkeypatch):
    """The CPU attention kernel with a bug that only heads of 128 meet: the last 8 lanes of each head's
    output halved (as a kernel that mishandles its last tile of a 128-wide head would)."""
    from mnngpu.backends.cpu.ops.attention import CPUAttention

    original = CPUAttention.onExecute

    def broken(self, inputs, outputs):
        original(self, inputs, outputs)
        if self.dim == 128:
            self.out[..., -8:] *= 0.5

    monkeypatch.setattr(CPUAttention, "onExecute", broken)


def first_prompt_check(folder) -> None:
    ref = json.loads((folder / "reference.json").read_text())
    first_logits = np.load(folder / "first_logits.npy")
    checks.check_greedy_and_first_logits(checks.load(folder, "cpu"), ref["prompts"][0], first_logits[0])


def test_a_head_dim_128_bug_fails_the_real_width_check_only(width_models, request):
    real_width = width_models / "dense_h1024"
    first_prompt_check(real_width)
    request.getfixturevalue("broken_wide_attention")
    with pytest.raises(AssertionError, match="logits differ"):
        first_prompt_check(real_width)
    # the tiny fixtures' heads of 32 never meet the bug: only a real width finds it
    first_prompt_check(FIXTURES / "qwen3_int4_b64")
