"""Every backend on every fixture model, against what MNN's runtime recorded.

Greedy tokens must be identical for every recorded prompt, and first-step logits within
1e-3 x the logits' std (precision high). Where the recording holds them (the newer-format
fixtures, recorded by tools/mnn_recorder.cpp), every greedy step's top logits and every row of
an all_logits prefill are held to the same tolerance (the comparisons: tests/conformance/checks.py).
Where `mnn` is installed, a live MNN run in a subprocess checks that every fixture's recording is
still what MNN does (a newer-format fixture's, where $MNN_HEAD_BUILD names that MNN's build).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


STEP_RECORDS = [name for name in MODEL_NAMES if "steps_top" in reference(name)[0]["prompts"][0]]


@pytest.mark.parametrize("name", STEP_RECORDS)
def test_every_decode_steps_top_logits_match_mnn(name, backend_type):
    """Where MNN's runtime recorded each greedy step's top logits (tools/mnn_recorder.cpp), every step
    is held to the first step's tolerance, not only to its argmax."""
    ref, _ = reference(name)
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


ROW_RECORDS = [name for name in MODEL_NAMES if any("rows_top" in p for p in reference(name)[0]["prompts"])]


@pytest.mark.parametrize("name", ROW_RECORDS)
def test_all_logits_rows_match_mnn(name, backend_type):
    """Every row of an all_logits prefill (what echo logprobs and lm-eval's loglikelihoods read) against
    MNN's own all_logits rows, where its runtime recorded them (their top 8 logits each)."""
    ref, _ = reference(name)
    prompt = next(p for p in ref["prompts"] if "rows_top" in p)
    rows = checks.all_logits_rows(load(name, backend_type, all_logits=True), prompt["ids"])
    checks.check_every_row(rows, prompt)


HEAD_RECORDED = [name for name in MODEL_NAMES if "recorded_by" in reference(name)[0]]
WHEEL_RECORDED = [name for name in MODEL_NAMES if name not in HEAD_RECORDED]


def live_wheel_record(name: str, tmp_path: Path) -> tuple[list[dict], np.ndarray]:
    """tests/mnn_oracle.py on the fixture's prompts with its recorded settings, in one MNN process, or
    one per prompt where the recording was made so (MNN's reset() keeps a recurrent layer's state)."""
    ref, _ = reference(name)
    texts = [p["text"] for p in ref["prompts"]]
    batches = [[text] for text in texts] if ref.get("fresh_instance_per_prompt") else [texts]
    prompts, logits = [], []
    oracle = Path(__file__).resolve().parents[1] / "mnn_oracle.py"
    for k, batch in enumerate(batches):
        out, npy = tmp_path / f"live{k}.json", tmp_path / f"live{k}.npy"
        subprocess.run([sys.executable, str(oracle), str(FIXTURES / name), "--prompts-json", json.dumps(batch),
                        "--config-json", json.dumps(ref["settings"]), "--steps", str(len(ref["prompts"][0]["greedy"])),
                        "--json-out", str(out), "--logits-out", str(npy)],
                       check=True, capture_output=True, timeout=300)
        prompts += json.loads(out.read_text())["prompts"]
        logits.append(np.load(npy))
    return prompts, np.concatenate(logits)


@pytest.mark.parametrize("name", WHEEL_RECORDED)
def test_live_mnn_agrees_with_recording(name, tmp_path):
    """The recorded references are still what MNN does (skipped without the `mnn` wheel): every
    fixture, every prompt, its ids, its greedy tokens and its first-step logits."""
    pytest.importorskip("MNN.llm")
    ref, first_logits = reference(name)
    live, live_logits = live_wheel_record(name, tmp_path)
    assert len(live) == len(ref["prompts"])
    for recorded, now in zip(ref["prompts"], live):
        assert now["ids"] == recorded["ids"] and now["greedy"] == recorded["greedy"], recorded["text"]
    assert np.allclose(live_logits, first_logits, atol=1e-5)


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
        assert np.allclose([v for _, v in now["steps_top"]], [v for _, v in recorded["steps_top"]], atol=1e-5)
        assert [i for i, _ in now["steps_top"]] == [i for i, _ in recorded["steps_top"]], recorded["text"]
        if "rows_top" in recorded:
            rows = head_export.record_prefill_rows(FIXTURES / name / "config.json", recorded["ids"], ref["settings"])
            assert [i for i, _ in rows] == [i for i, _ in recorded["rows_top"]], recorded["text"]
            assert np.allclose([v for _, v in rows], [v for _, v in recorded["rows_top"]], atol=1e-5)
    assert np.allclose(live_logits, first_logits, atol=1e-5)
