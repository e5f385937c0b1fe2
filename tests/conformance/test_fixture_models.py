"""Every backend on every fixture model, against what MNN's runtime recorded.

Greedy tokens must be identical for every recorded prompt, and first-step logits within
1e-3 x the logits' std (precision high). Every fixture's recording also holds every greedy step's
top 8 logits and one prompt's all_logits rows (top 8 each), held to the same tolerance (the
comparisons: tests/conformance/checks.py). Where `mnn` is installed, a live MNN run in a subprocess
checks that every fixture's recording is still what MNN does (a newer-format fixture's, where
$MNN_HEAD_BUILD names that MNN's build).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.conformance import checks
from tests.conftest import FIXTURES, MODEL_NAMES, reference

# what the other conformance tests import from here
LOGIT_TOLERANCE = checks.LOGIT_TOLERANCE
greedy = checks.greedy


def load(name: str, backend_type: str, **overrides):
    return checks.load(FIXTURES / name, backend_type, **overrides)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_greedy_and_logits_match_mnn(name, backend_type):
    ref, first_logits = reference(name)
    model = load(name, backend_type)
    for k, prompt in enumerate(ref["prompts"]):
        checks.check_greedy_and_first_logits(model, prompt, first_logits[k])


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_decode_steps_top_logits_match_mnn(name, backend_type):
    """Each greedy step's top logits as MNN's runtime recorded them (tools/record_steps_top.py for the
    wheel's fixtures, tools/mnn_recorder.cpp for the newer-format ones): every step is held to the first
    step's tolerance, not only to its argmax."""
    ref, _ = reference(name)
    assert all("steps_top" in prompt for prompt in ref["prompts"]), f"{name}: no steps_top recorded"
    model = load(name, backend_type)
    for prompt in ref["prompts"]:
        checks.check_every_step(model, prompt)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_all_logits_rows_match_last_row(name, backend_type):
    """all_logits returns one row per prompt token; its last row is the last-row result."""
    ref, first_logits = reference(name)
    prompt = ref["prompts"][1]
    model = load(name, backend_type, all_logits=True)
    logits = np.asarray(model.forward(prompt["ids"]))
    assert logits.shape == (1, len(prompt["ids"]), first_logits.shape[1])
    checks.check_first_logits(logits[0, -1], first_logits[1], f"{prompt['text']!r}, last all_logits row")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_all_logits_rows_match_mnn(name, backend_type):
    """Every row of an all_logits prefill (what echo logprobs and lm-eval's loglikelihoods read) against
    MNN's own all_logits rows for the prompt that has them recorded (their top 8 logits each)."""
    ref, _ = reference(name)
    prompt = next((p for p in ref["prompts"] if "rows_top" in p), None)
    assert prompt is not None, f"{name}: no prompt has rows_top recorded"
    rows = checks.all_logits_rows(load(name, backend_type, all_logits=True), prompt["ids"])
    checks.check_every_row(rows, prompt)


HEAD_RECORDED = [name for name in MODEL_NAMES if "recorded_by" in reference(name)[0]]
WHEEL_RECORDED = [name for name in MODEL_NAMES if name not in HEAD_RECORDED]


def assert_same_tops(live: list, recorded: list, where: str) -> None:
    """Top logits re-recorded live ([ids, values] per step or row) against the committed ones."""
    assert [ids for ids, _ in live] == [ids for ids, _ in recorded], where
    assert np.allclose([v for _, v in live], [v for _, v in recorded], atol=1e-5), where


@pytest.mark.parametrize("name", WHEEL_RECORDED)
def test_live_mnn_agrees_with_recording(name, tmp_path):
    """The recorded references are still what MNN does (skipped without the `mnn` wheel): every
    fixture, every prompt, its ids, its greedy tokens, every step's top logits and its first-step
    logits, and the all_logits rows of the prompt that has them, re-recorded as
    tools/record_steps_top.py records them (one MNN process per prompt where the recording was made so:
    MNN's reset() keeps a recurrent layer's state)."""
    pytest.importorskip("MNN.llm")
    from tools import record_steps_top

    ref, first_logits = reference(name)
    live, live_logits = record_steps_top.record_steps(FIXTURES / name, ref, tmp_path)
    assert len(live) == len(ref["prompts"])
    for recorded, now in zip(ref["prompts"], live):
        assert now["ids"] == recorded["ids"] and now["greedy"] == recorded["greedy"], recorded["text"]
        assert_same_tops(now["steps_top"], recorded["steps_top"], recorded["text"])
    assert np.allclose(live_logits, first_logits, atol=1e-5)
    rows_prompt = next(p for p in ref["prompts"] if "rows_top" in p)
    assert_same_tops(record_steps_top.record_rows(FIXTURES / name, ref, tmp_path), rows_prompt["rows_top"],
                     f"{rows_prompt['text']!r}, all_logits rows")


@pytest.mark.parametrize("name", HEAD_RECORDED)
def test_live_head_mnn_agrees_with_recording(name):
    """The newer-format fixtures' recordings are still what MNN at tools/build_mnn.py's commit does
    (its mnn_recorder, one process per prompt): greedy tokens, every step's top logits, the
    first-step logits and the all_logits rows. Needs that build ($MNN_HEAD_BUILD), else skipped."""
    from tools import head_export

    if not os.environ.get(head_export.HEAD_BUILD_ENV):
        pytest.skip(f"the live check of a newer-format recording needs MNN {head_export.SHORT_COMMIT}'s build: "
                    f"set {head_export.HEAD_BUILD_ENV} (python -m tools.build_mnn)")
    ref, first_logits = reference(name)
    live, live_logits = head_export.record_head(FIXTURES / name, [(p["text"], p["ids"]) for p in ref["prompts"]],
                                                ref["settings"], first_logits.shape[1])
    for recorded, now in zip(ref["prompts"], live):
        assert now["greedy"] == recorded["greedy"], recorded["text"]
        assert_same_tops(now["steps_top"], recorded["steps_top"], recorded["text"])
        if "rows_top" in recorded:
            rows = head_export.record_prefill_rows(FIXTURES / name / "config.json", recorded["ids"], ref["settings"])
            assert_same_tops(rows, recorded["rows_top"], f"{recorded['text']!r}, all_logits rows")
    assert np.allclose(live_logits, first_logits, atol=1e-5)
