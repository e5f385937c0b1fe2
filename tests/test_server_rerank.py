"""POST /v1/rerank and /rerank against MNN's recorded Qwen3Reranker scores (rerank_reference.json), through
Cohere's client (its v1 rerank posts to /v1/rerank) and plain HTTP in llama-server's and vLLM's shape;
the kinds of model; bad input; `mnngpu rerank`."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import FIXTURES

RETRIEVAL = FIXTURES.parent / "retrieval"   # the embedding models and rerankers (tools/make_embedding_fixtures.py)
from tests.serving import running

pytest.importorskip("starlette")
from mnngpu.apps.server.app import create_app  # noqa: E402
from mnngpu.apps.server.rerank import ServedReranker  # noqa: E402

FOLDER = RETRIEVAL / "qwen3_reranker"
NAME = "qwen3-reranker-tiny"
RECORDED = json.loads((FOLDER / "rerank_reference.json").read_text())
QUERY = RECORDED["query"]
DOCUMENTS = [document["text"] for document in RECORDED["documents"]]
SCORES = [document["score"] for document in RECORDED["documents"]]
MNN_ORDER = sorted(range(len(SCORES)), key=lambda i: -SCORES[i])


@pytest.fixture(scope="module")
def server():
    served = ServedReranker.load(FOLDER, NAME, {"precision": "high", "thread_num": 2})
    with running(create_app(served)) as client:
        yield client


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_scores_are_mnns_most_relevant_first(server, path):
    reply = server.post(path, json={"model": NAME, "query": QUERY, "documents": DOCUMENTS,
                                    "return_documents": True})
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert [result["index"] for result in results] == MNN_ORDER
    for result in results:
        assert result["relevance_score"] == pytest.approx(SCORES[result["index"]], abs=1e-3)
        assert result["document"]["text"] == DOCUMENTS[result["index"]]
    usage = reply.json()["usage"]
    assert usage["prompt_tokens"] == sum(len(document["ids"]) for document in RECORDED["documents"])


def test_top_n_and_document_objects(server):
    documents = [{"text": text} for text in DOCUMENTS]
    results = server.post("/v1/rerank", json={"query": QUERY, "documents": documents, "top_n": 2}).json()["results"]
    assert [result["index"] for result in results] == MNN_ORDER[:2]
    assert all("document" not in result for result in results)


def test_cohere_client(server):
    cohere = pytest.importorskip("cohere")
    url = server.base_url
    client = cohere.Client(api_key="unused", base_url=f"http://{url.host}:{url.port}")
    reply = client.rerank(model=NAME, query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [result.index for result in reply.results] == MNN_ORDER[:3]
    np.testing.assert_allclose([result.relevance_score for result in reply.results],
                               [SCORES[i] for i in MNN_ORDER[:3]], atol=1e-3)


@pytest.mark.parametrize("body, param", [
    ({"documents": ["a"]}, "query"),
    ({"query": "", "documents": ["a"]}, "query"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": ["a", ""]}, "documents"),
    ({"query": "q", "documents": ["a"] * 10_000}, "documents"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": "q", "documents": ["a"], "rank_fields": ["title"]}, "rank_fields"),
    ({"query": "q", "documents": ["a"], "colour": "red"}, "colour"),
    ({"query": "q", "documents": ["word " * 3000]}, "documents"),
])
def test_bad_input_gets_a_400_naming_the_field(server, body, param):
    reply = server.post("/v1/rerank", json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_other_routes_name_the_kind(server):
    chat = server.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    embeddings = server.post("/v1/embeddings", json={"input": "hi"})
    for reply in (chat, embeddings):
        assert reply.status_code == 400 and "a reranker" in reply.json()["error"]["message"]
    assert server.get("/v1/models").json()["data"][0]["kind"] == "reranker"


def test_an_embedding_model_refuses_rerank():
    from mnngpu.apps.server.embeddings import ServedEmbeddingModel

    served = ServedEmbeddingModel.load(RETRIEVAL / "qwen3_embedding", "embedder", {"thread_num": 2})
    with running(create_app(served)) as client:
        reply = client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
        assert reply.status_code == 400 and "an embedding model" in reply.json()["error"]["message"]


def test_mnngpu_rerank_prints_mnns_scores_most_relevant_first():
    done = subprocess.run([sys.executable, "-m", "mnngpu", "rerank", str(FOLDER), "--precision", "high",
                           "--query", QUERY, *DOCUMENTS], capture_output=True, text=True, check=True)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["index"] for line in lines] == MNN_ORDER
    for line in lines:
        assert line["relevance_score"] == pytest.approx(SCORES[line["index"]], abs=1e-3)
