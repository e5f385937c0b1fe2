"""Every backend on every fixture model, against what MNN's runtime recorded.

Greedy tokens must be identical for every recorded prompt, and first-step logits within
1e-3 x the logits' std (precision high). Where the recording holds them (the newer-format
fixtures, recorded by tools/mnn_recorder.cpp), every greedy step's top logits and every row of
an all_logits prefill are held to the same tolerance. Where `mnn` is installed, a live MNN run in
a subprocess checks the recording is still what MNN does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from tests.conftest import FIXTURES, MODEL_NAMES, reference

LOGIT_TOLERANCE = 1e-3


def load(name: str, backend_type: str, **overrides):
    model = mnngpu_llm.create(FIXTURES / name)
    model.set_config({"backend_type": backend_type, "precision": "high", "memory": "high", "thread_num": 2,
                      **overrides})
    model.load()
    return model


def greedy(model, ids: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    model.reset()
    logits = np.asarray(model.forward(ids))[0, -1]
    first = logits.copy()
    tokens = [int(np.argmax(logits))]
    while len(tokens) < steps:
        tokens.append(int(np.argmax(np.asarray(model.forward([tokens[-1]]))[0, -1])))
    return tokens, first


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_greedy_and_logits_match_mnn(name, backend_type):
    ref, first_logits = reference(name)
    model = load(name, backend_type)
    for k, prompt in enumerate(ref["prompts"]):
        tokens, first = greedy(model, prompt["ids"], len(prompt["greedy"]))
        scale = float(first_logits[k].std())
        assert np.abs(first - first_logits[k]).max() <= LOGIT_TOLERANCE * scale, prompt["text"]
        assert tokens == prompt["greedy"], prompt["text"]


STEP_RECORDS = [name for name in MODEL_NAMES if "steps_top" in reference(name)[0]["prompts"][0]]


@pytest.mark.parametrize("name", STEP_RECORDS)
def test_every_decode_steps_top_logits_match_mnn(name, backend_type):
    """Where MNN's runtime recorded each greedy step's top logits (tools/mnn_recorder.cpp), every step
    is held to the first step's tolerance, not only to its argmax."""
    ref, _ = reference(name)
    model = load(name, backend_type)
    for prompt in ref["prompts"]:
        model.reset()
        logits = np.asarray(model.forward(prompt["ids"]))[0, -1]
        for step, (ids, recorded) in enumerate(prompt["steps_top"]):
            gap = np.abs(logits[ids] - np.asarray(recorded, np.float32)).max()
            assert gap <= LOGIT_TOLERANCE * logits.std(), (prompt["text"], step)
            logits = np.asarray(model.forward([prompt["greedy"][step]]))[0, -1]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_all_logits_rows_match_last_row(name, backend_type):
    """all_logits returns one row per prompt token; its last row is the last-row result."""
    ref, first_logits = reference(name)
    prompt = ref["prompts"][1]
    model = load(name, backend_type, all_logits=True)
    logits = np.asarray(model.forward(prompt["ids"]))
    assert logits.shape == (1, len(prompt["ids"]), first_logits.shape[1])
    assert np.abs(logits[0, -1] - first_logits[1]).max() <= LOGIT_TOLERANCE * first_logits[1].std()


ROW_RECORDS = [name for name in MODEL_NAMES if any("rows_top" in p for p in reference(name)[0]["prompts"])]


@pytest.mark.parametrize("name", ROW_RECORDS)
def test_all_logits_rows_match_mnn(name, backend_type):
    """Every row of an all_logits prefill (what echo logprobs and lm-eval's loglikelihoods read) against
    MNN's own all_logits rows, where its runtime recorded them (their top 8 logits each)."""
    ref, _ = reference(name)
    prompt = next(p for p in ref["prompts"] if "rows_top" in p)
    logits = np.asarray(load(name, backend_type, all_logits=True).forward(prompt["ids"]))[0]
    assert logits.shape[0] == len(prompt["rows_top"]) == len(prompt["ids"])
    for row, (ids, recorded) in enumerate(prompt["rows_top"]):
        gap = np.abs(logits[row, ids] - np.asarray(recorded, np.float32)).max()
        assert gap <= LOGIT_TOLERANCE * logits[row].std(), row


def test_live_mnn_agrees_with_recording(tmp_path):
    """The recorded references are still what MNN does (skipped without the `mnn` wheel)."""
    pytest.importorskip("MNN.llm")
    name = MODEL_NAMES[0]
    ref, first_logits = reference(name)
    out = tmp_path / "live.json"
    oracle = Path(__file__).resolve().parents[1] / "mnn_oracle.py"
    prompts = [p["text"] for p in ref["prompts"][:2]]
    subprocess.run([sys.executable, str(oracle), str(FIXTURES / name), "--prompts-json", json.dumps(prompts),
                    "--json-out", str(out), "--logits-out", str(tmp_path / "live.npy")],
                   check=True, capture_output=True, timeout=300)
    live = json.loads(out.read_text())
    for recorded, now in zip(ref["prompts"], live["prompts"]):
        assert now["ids"] == recorded["ids"] and now["greedy"] == recorded["greedy"]
    assert np.allclose(np.load(tmp_path / "live.npy"), first_logits[:2], atol=1e-5)
