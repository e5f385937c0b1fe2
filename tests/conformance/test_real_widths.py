"""Every backend on models at real widths against MNN 3.6.1: hidden 1024, heads of 128, the real
151,936-entry vocabulary with int4 weights and embeddings, for a dense, a MoE and a Gated-DeltaNet
layer (tools/make_width_models.py, built at test time: tests/conformance/conftest.py).

The committed fixtures stop at hidden 128 and a 480-entry vocabulary; these catch what only shows at
a real width (a kernel's tiling of a 128-wide head, a 150k-row lm_head in one buffer). Each prompt:
16 greedy tokens identical to MNN's, the first step's logits and every step's top 8 logits within
1e-3 x the logits' std, and so is every row of one prompt's all_logits prefill.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conformance import checks
from tools.make_width_models import NAMES


def recorded(folder) -> tuple[dict, np.ndarray]:
    return json.loads((folder / "reference.json").read_text()), np.load(folder / "first_logits.npy")


@pytest.mark.parametrize("name", NAMES)
def test_real_width_model_matches_mnn(name, backend_type, width_models):
    folder = width_models / name
    reference, first_logits = recorded(folder)
    model = checks.load(folder, backend_type)
    for k, prompt in enumerate(reference["prompts"]):
        checks.check_greedy_and_first_logits(model, prompt, first_logits[k])
        checks.check_every_step(model, prompt)


@pytest.mark.parametrize("name", NAMES)
def test_real_width_all_logits_rows_match_mnn(name, backend_type, width_models):
    """Every row of an all_logits prefill (151,936 logits a row) against MNN's own rows."""
    folder = width_models / name
    reference, _ = recorded(folder)
    prompt = next(p for p in reference["prompts"] if "rows_top" in p)
    rows = checks.all_logits_rows(checks.load(folder, backend_type, all_logits=True), prompt["ids"])
    checks.check_every_row(rows, prompt)


def test_the_models_have_the_real_widths(width_models):
    """The exporter's and MNN's own account of each model: hidden 1024, the full vocabulary in MNN's
    logits, and the lm_head tied to an int4 embedding (llm_config's tie_embeddings: offsets, bits, block)."""
    for name in NAMES:
        config = json.loads((width_models / name / "llm_config.json").read_text())
        _, first_logits = recorded(width_models / name)
        assert config["hidden_size"] == 1024 and first_logits.shape[1] == 151936, name
        assert config["tie_embeddings"][3:] == [4, 64], name
