"""Gemma 4 (per-layer embeddings, a sliding and a full layer with their own rotary) on every backend,
against the HuggingFace source run in float64 with the weight values the exporter stores (the truth
of test_hf_float64.py).

MNN 3.6.1 departs from that truth on this family: the exporter rotates the full layer's partial
rotary on the first rotary_dim dims of a head, where HF's proportional rotary pairs dims half a head
apart (docs/formats.md). mnngpu runs the graph as exported, so per prompt its first-step logits must
be no further from the truth than MNN's, and its greedy tokens the truth's wherever MNN's are.
MNN's reset() also keeps the last step's per-layer rows, which its next prompt then reads (its
references come from one fresh instance per prompt): after mnngpu's reset() a prompt gives what a
fresh load gives.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from tests.conformance.test_fixture_models import LOGIT_TOLERANCE, greedy, load
from tests.conformance.test_hf_float64 import SLACK, export_options, float64_source_model
from tests.conftest import reference

NAME = "gemma4_int4_b64"
STEPS = 16


@cache
def hf_truth() -> tuple[list[np.ndarray], list[list[int]]]:
    """The truth's first-step logits and greedy tokens for each recorded prompt."""
    torch = pytest.importorskip("torch")
    ref, _ = reference(NAME)
    model = float64_source_model(NAME, export_options(ref["export_args"]))
    firsts, tokens = [], []
    with torch.no_grad():
        for prompt in ref["prompts"]:
            ids = torch.tensor([prompt["ids"]])
            firsts.append(model(ids).logits[0, -1].numpy())
            out = model.generate(ids, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False)
            tokens.append(out[0, ids.shape[1]:].tolist())
    return firsts, tokens


def test_no_further_from_the_float64_source_than_mnn(backend_type):
    ref, mnn_first = reference(NAME)
    truth_first, truth_tokens = hf_truth()
    model = load(NAME, backend_type)
    agreeing = 0
    for k, prompt in enumerate(ref["prompts"]):
        tokens, first = greedy(model, prompt["ids"], STEPS)
        scale = float(truth_first[k].std())
        ours = np.abs(first - truth_first[k]).max() / scale
        mnn = np.abs(mnn_first[k] - truth_first[k]).max() / scale
        assert ours <= mnn + SLACK, (prompt["text"], ours, mnn)
        if prompt["greedy"] == truth_tokens[k]:
            agreeing += 1
            assert tokens == truth_tokens[k], prompt["text"]
    assert agreeing, "MNN agrees with the truth on no prompt: the greedy check checked nothing"


def test_a_prompt_after_reset_is_a_fresh_load(backend_type):
    ref, _ = reference(NAME)
    first, second = ref["prompts"][1], ref["prompts"][2]
    model = load(NAME, backend_type)
    greedy(model, first["ids"], 4)
    tokens, logits = greedy(model, second["ids"], STEPS)   # greedy() resets first
    fresh_tokens, fresh_logits = greedy(load(NAME, backend_type), second["ids"], STEPS)
    assert tokens == fresh_tokens == second["greedy"]
    assert np.abs(logits - fresh_logits).max() <= LOGIT_TOLERANCE * 1e-3 * fresh_logits.std()
