"""Embedding exports (tools/make_embedding_fixtures.py) against MNN 3.6.1's recorded txt_embedding,
on every backend: each text alone, and all of them packed into one forward."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from tests.conftest import FIXTURES

RETRIEVAL = FIXTURES.parent / "retrieval"   # the embedding models and rerankers (tools/make_embedding_fixtures.py)

EMBEDDING_MODELS = sorted(p.name for p in RETRIEVAL.iterdir() if (p / "embedding_reference.json").exists())
COSINE_MIN = 0.99999
MAX_ERROR_OF_NORM = 1e-3


def recorded(name: str) -> list[dict]:
    return json.loads((RETRIEVAL / name / "embedding_reference.json").read_text())["prompts"]


def assert_agrees(vector: np.ndarray, expected: np.ndarray, text: str) -> None:
    vector, expected = np.asarray(vector, dtype=np.float64).ravel(), np.asarray(expected, dtype=np.float64).ravel()
    norm = np.linalg.norm(expected)
    cosine = vector @ expected / (np.linalg.norm(vector) * norm)
    error = np.abs(vector - expected).max()
    assert cosine >= COSINE_MIN and error <= MAX_ERROR_OF_NORM * norm, \
        f"{text!r}: cosine {cosine:.7f}, max error {error:.2e} of norm {norm:.3f}"


@pytest.fixture(scope="module", params=EMBEDDING_MODELS)
def model_name(request) -> str:
    return request.param


@pytest.fixture
def model(model_name, backend_type):
    model = mnngpu_llm.create(RETRIEVAL / model_name / "config.json", embedding_model=True)
    model.set_config({"backend_type": backend_type, "precision": "high", "thread_num": 2})
    model.load()
    return model


def test_txt_embedding_matches_mnn(model, model_name):
    for prompt in recorded(model_name):
        vector = model.txt_embedding(prompt["text"])
        assert vector.shape == tuple(prompt["shape"])
        assert_agrees(vector.read(), prompt["embedding"], prompt["text"])


def test_packed_batch_matches_mnn(model, model_name):
    prompts = recorded(model_name)
    vectors = model.embed([prompt["text"] for prompt in prompts])
    assert vectors.shape == (len(prompts), model.dim)
    for vector, prompt in zip(vectors, prompts):
        assert_agrees(vector, prompt["embedding"], prompt["text"])
