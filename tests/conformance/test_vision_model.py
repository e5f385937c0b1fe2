"""The Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5 fixtures (tools/make_vision_fixture.py) on every backend.

* image embeddings (and Qwen3-VL's deepstack features): visual.mnn run by the engine against MNN's
  runtime on MNN-made patches, within 1e-3 of their std, at the config's image_size and at a
  prompt's <hw> size;
* prompts with an image: first-step logits within 1e-3 of their std and 16 identical greedy
  tokens against the HuggingFace model run in float64 on the export's own weights (MNN 3.6.1's
  wheel records logits 8-18% of their std away from that reference for these prompts; see
  docs/vision.md), with the text-only prompt also against MNN's record;
* the vision graph on the backend named by the config's mllm.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mnngpu.omni import Omni
from mnngpu.omni.vision import read_image
from tests.conformance.test_fixture_models import greedy
from tests.conftest import FIXTURES, load_multimodal

VISION = FIXTURES.parent / "vision"
NAMES = sorted(p.name for p in VISION.iterdir() if (p / "reference.json").exists())
TOLERANCE = 1e-3
pytest.importorskip("PIL")


@pytest.mark.parametrize("name", NAMES)
def test_vision_model_matches_references(name, backend_type):
    folder = VISION / name
    ref = json.loads((folder / "reference.json").read_text())
    mnn_embeds = np.load(folder / "image_embeds.npz")
    hf_logits = np.load(folder / "hf_first_logits.npy")
    mnn_logits = np.load(folder / "first_logits.npy")
    model = load_multimodal(folder, backend_type)
    assert isinstance(model, Omni)
    image = read_image(folder / "image.png")
    for height, width in ref["embed_sizes"]:
        assert model.vision.align(height, width) == (height, width)
        encoded = model.vision.encode(image, (height, width))
        expected = mnn_embeds[f"{height}x{width}"]
        assert encoded.rows.shape == expected.shape
        assert np.abs(encoded.rows - expected).max() <= TOLERANCE * expected.std(), (height, width)
        if f"deepstack {height}x{width}" in mnn_embeds:
            expected = mnn_embeds[f"deepstack {height}x{width}"]
            assert encoded.deepstack.shape == expected.shape
            assert np.abs(encoded.deepstack - expected).max() <= TOLERANCE * expected.std(), (height, width)
    for k, prompt in enumerate(ref["prompts"]):
        model.reset()
        ids = model.tokenizer_encode(prompt["text"].format(image=folder / "image.png"))
        assert ids == prompt["ids"], prompt["text"]
        tokens, first = greedy(model, ids, len(prompt["hf_greedy"]))
        assert np.abs(first - hf_logits[k]).max() <= TOLERANCE * hf_logits[k].std(), prompt["text"]
        assert tokens == prompt["hf_greedy"], prompt["text"]
        if "<img>" not in prompt["text"]:
            assert np.abs(first - mnn_logits[k]).max() <= TOLERANCE * mnn_logits[k].std()
            assert tokens == prompt["greedy"]
