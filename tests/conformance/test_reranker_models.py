"""Qwen3-Reranker (tools/make_embedding_fixtures.py) against what MNN's Qwen3Reranker computes, recorded
from MNN 3.6.1's runtime (rerank_reference.json), on every backend: the ids, the scores to 1e-3, the order."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mnngpu.engine.reranker import SUFFIX, Qwen3Reranker, rerank_prefix
from tests.conftest import FIXTURES

RETRIEVAL = FIXTURES.parent / "retrieval"   # the embedding models and rerankers (tools/make_embedding_fixtures.py)

FOLDER = RETRIEVAL / "qwen3_reranker"
RECORDED = json.loads((FOLDER / "rerank_reference.json").read_text())


@pytest.fixture
def reranker(backend_type):
    reranker = Qwen3Reranker(FOLDER / "config.json")
    reranker.set_config({"backend_type": backend_type, "precision": "high", "thread_num": 2})
    reranker.load()
    reranker.set_instruct(RECORDED["instruct"])
    return reranker


def test_the_prompt_ids_are_mnns(reranker):
    encode = reranker.llm.tokenizer_encode
    assert (reranker.yes_id, reranker.no_id) == (RECORDED["yes_id"], RECORDED["no_id"])
    for document in RECORDED["documents"]:
        assert encode(rerank_prefix("", RECORDED["query"])) + encode(document["text"]) + encode(SUFFIX) == \
            document["ids"]


def test_scores_match_mnn_to_1e3_in_the_same_order(reranker):
    scores = reranker.compute_scores(RECORDED["query"], [document["text"] for document in RECORDED["documents"]])
    expected = [document["score"] for document in RECORDED["documents"]]
    np.testing.assert_allclose(scores, expected, atol=1e-3)
    assert np.argsort(scores).tolist() == np.argsort(expected).tolist()
