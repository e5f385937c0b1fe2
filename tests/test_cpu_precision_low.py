"""The CPU backend's precision-low path (int16 activations in the decode GEMV, and whatever else it
uses) keeps logits within 2e-2 x std of MNN's precision-high output.

The fixtures' recorded first-step logits are MNN's at precision high. The 24-layer benchmark model
(bench_models/, made by tools/make_bench_model.py, not committed) is checked against a live MNN run
when it is there: a deep stack is where low-precision error would grow.
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

LOW_TOLERANCE = 2e-2
ROOT = Path(__file__).resolve().parents[1]
BENCH_MODEL = ROOT / "bench_models" / "qwen2_5_0_5b_shape"


def load_low(folder: Path):
    model = mnngpu_llm.create(folder)
    model.set_config({"backend_type": "cpu", "precision": "low", "memory": "low", "thread_num": 2})
    model.load()
    return model


def first_logits(model, ids: list[int]) -> np.ndarray:
    model.reset()
    return np.asarray(model.forward(ids))[0, -1]


def decode_logits(model, ids: list[int], steps: int) -> list[np.ndarray]:
    """Logits of `steps` greedy decode steps after `ids` (the int16 GEMV path)."""
    rows = [first_logits(model, ids)]
    for _ in range(steps):
        rows.append(np.asarray(model.forward([int(np.argmax(rows[-1]))]))[0, -1])
    return rows


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_low_precision_logits_stay_near_mnn_high(name):
    ref, recorded = reference(name)
    model = load_low(FIXTURES / name)
    for k, prompt in enumerate(ref["prompts"][:3]):
        got = first_logits(model, prompt["ids"])
        assert np.abs(got - recorded[k]).max() <= LOW_TOLERANCE * recorded[k].std(), prompt["text"]


@pytest.mark.parametrize("name", MODEL_NAMES[:2])
def test_low_precision_decode_steps_stay_near_high(name):
    """The decode steps (one-row GEMVs, where int16 activations are used) against this engine's own
    precision-high run, which the conformance suite holds to 1e-3 x std of MNN."""
    ref, _ = reference(name)
    ids = ref["prompts"][1]["ids"]
    low = decode_logits(load_low(FIXTURES / name), ids, 4)
    high_model = mnngpu_llm.create(FIXTURES / name)
    high_model.set_config({"backend_type": "cpu", "precision": "high", "thread_num": 2})
    high_model.load()
    high_model.reset()
    high = [np.asarray(high_model.forward(ids))[0, -1]]
    for row in low[:-1]:
        high.append(np.asarray(high_model.forward([int(np.argmax(row))]))[0, -1])
    for got, want in zip(low, high):
        assert np.abs(got - want).max() <= LOW_TOLERANCE * want.std()


@pytest.mark.skipif(not (BENCH_MODEL / "llm.mnn").exists(), reason="bench model not made (python -m tools.make_bench_model)")
def test_bench_model_low_precision_near_live_mnn_high(tmp_path):
    pytest.importorskip("MNN.llm")
    prompts = ["The quick brown fox jumps over the lazy dog"]
    out = tmp_path / "mnn.json"
    oracle = ROOT / "tests" / "mnn_oracle.py"
    subprocess.run([sys.executable, str(oracle), str(BENCH_MODEL), "--prompts-json", json.dumps(prompts),
                    "--steps", "3", "--json-out", str(out), "--logits-out", str(tmp_path / "mnn.npy")],
                   check=True, capture_output=True, timeout=600)
    mnn = json.loads(out.read_text())["prompts"][0]
    want = np.load(tmp_path / "mnn.npy")[0]
    got = first_logits(load_low(BENCH_MODEL), mnn["ids"])
    assert np.abs(got - want).max() <= LOW_TOLERANCE * want.std()
