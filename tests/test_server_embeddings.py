"""POST /v1/embeddings through clients nobody here wrote (the `openai` package, LangChain's
OpenAIEmbeddings), against MNN's recorded txt_embedding scaled to unit length; the kinds of model
each route takes; bad input; /metrics and /v1/models; and `mnngpu embed` giving the same vectors."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from tests.conftest import FIXTURES

RETRIEVAL = FIXTURES.parent / "retrieval"   # the embedding models and rerankers (tools/make_embedding_fixtures.py)
from tests.serving import openai_client, running

pytest.importorskip("starlette")
from mnngpu.apps.server.app import create_app  # noqa: E402
from mnngpu.apps.server.embeddings import MAX_INPUTS, ServedEmbeddingModel  # noqa: E402

FOLDER = RETRIEVAL / "qwen3_embedding"
NAME = "qwen3-embedding-tiny"
RECORDED = json.loads((FOLDER / "embedding_reference.json").read_text())["prompts"]
TEXTS = [prompt["text"] for prompt in RECORDED]


def unit(vector) -> np.ndarray:
    vector = np.asarray(vector, dtype=np.float64).ravel()
    return vector / np.linalg.norm(vector)


def mnn_unit(index: int) -> np.ndarray:
    return unit(RECORDED[index]["embedding"])


def load(folder=FOLDER, **settings):
    model = mnngpu_llm.create(folder, embedding_model=True)
    model.set_config({"precision": "high", "thread_num": 2, **settings})
    model.load()
    return model


@pytest.fixture(scope="module")
def server():
    with running(create_app(ServedEmbeddingModel(load(), NAME))) as client:
        yield client


def assert_close(vector, truth) -> None:
    vector = np.asarray(vector, dtype=np.float64)
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)
    assert vector @ truth >= 0.99999 and np.abs(vector - truth).max() <= 1e-3


def test_openai_client_gets_mnn_vectors_at_unit_length(server):
    reply = openai_client(server).embeddings.create(model=NAME, input=TEXTS)   # the client asks for base64
    assert [item.index for item in reply.data] == list(range(len(TEXTS)))
    for index, item in enumerate(reply.data):
        assert_close(item.embedding, mnn_unit(index))
    model = load()
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(len(model.prompt_ids(t)) for t in TEXTS)


def test_float_and_base64_carry_the_same_vector(server):
    floats = server.post("/v1/embeddings", json={"input": TEXTS[1], "encoding_format": "float"}).json()
    packed = server.post("/v1/embeddings", json={"input": TEXTS[1], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.asarray(floats["data"][0]["embedding"], dtype=np.float32))
    assert_close(decoded, mnn_unit(1))


def test_token_ids_are_embedded_as_given(server):
    ids = load().prompt_ids(TEXTS[2])   # the ids txt_embedding embeds
    one = server.post("/v1/embeddings", json={"input": ids, "encoding_format": "float"}).json()
    many = server.post("/v1/embeddings", json={"input": [ids, ids], "encoding_format": "float"}).json()
    assert_close(one["data"][0]["embedding"], mnn_unit(2))
    assert len(many["data"]) == 2 and many["usage"]["prompt_tokens"] == 2 * len(ids)


def test_langchain_openai_embeddings(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    url = server.base_url
    embeddings = langchain_openai.OpenAIEmbeddings(model=NAME, base_url=f"http://{url.host}:{url.port}/v1",
                                                   api_key="unused", check_embedding_ctx_length=False)
    vectors = embeddings.embed_documents(TEXTS[:3])
    for index, vector in enumerate(vectors):
        assert_close(vector, mnn_unit(index))
    assert_close(embeddings.embed_query(TEXTS[3]), mnn_unit(3))


def test_dimensions_is_refused_without_matryoshka(server):
    reply = server.post("/v1/embeddings", json={"input": "hello", "dimensions": 16})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "dimensions" and "matryoshka" in reply.json()["error"]["message"]


def test_dimensions_cuts_then_renormalizes_where_declared():
    with running(create_app(ServedEmbeddingModel(load(matryoshka=True), NAME))) as client:
        reply = client.post("/v1/embeddings", json={"input": TEXTS[0], "dimensions": 16,
                                                    "encoding_format": "float"}).json()
        vector = np.asarray(reply["data"][0]["embedding"])
        assert vector.shape == (16,)
        assert_close(vector, unit(RECORDED[0]["embedding"][:16]))
        too_many = client.post("/v1/embeddings", json={"input": "hello", "dimensions": 65})
        assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "dimensions"


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": ["ok", 3.5]}, "input"),
    ({"input": ["x"] * 10_000}, "input"),
    ({"input": [10_000_000]}, "input"),
    ({}, "input"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "hi", "truncate": True}, "truncate"),
])
def test_bad_input_gets_a_400_naming_the_field(server, body, param):
    reply = server.post("/v1/embeddings", json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_a_text_longer_than_the_limit_gets_a_400(server):
    reply = server.post("/v1/embeddings", json={"input": "hello " * 3000})
    assert reply.status_code == 400
    assert "max_all_tokens" in reply.json()["error"]["message"]


def test_at_most_max_inputs_are_taken(server):
    assert server.post("/v1/embeddings", json={"input": ["x"] * (MAX_INPUTS + 1)}).status_code == 400


def test_chat_on_an_embedding_model_names_its_kind(server):
    reply = server.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "wrong_model_kind"
    assert "an embedding model" in reply.json()["error"]["message"]


def test_models_list_says_the_kind(server):
    assert [(m["id"], m["kind"]) for m in server.get("/v1/models").json()["data"]] == [(NAME, "embedding")]


def test_metrics_count_embedding_requests_and_tokens(server):
    def counts() -> dict[str, float]:
        text = server.get("/metrics").text
        return {name: float(line.split()[-1]) for line in text.splitlines() for name in
                ("mnngpu_embedding_requests_total", "mnngpu_embedding_tokens_total") if line.startswith(name + " ")}

    before = counts()
    ids = load().prompt_ids(TEXTS[0])
    server.post("/v1/embeddings", json={"input": [TEXTS[0], TEXTS[0]]})
    after = counts()
    assert after["mnngpu_embedding_requests_total"] == before.get("mnngpu_embedding_requests_total", 0) + 1
    assert after["mnngpu_embedding_tokens_total"] == before.get("mnngpu_embedding_tokens_total", 0) + 2 * len(ids)


def test_an_llm_server_refuses_embeddings_naming_its_kind():
    from mnngpu.apps.server.engine import ServedModel

    llm = mnngpu_llm.create(FIXTURES / "qwen3_int4_b64")
    llm.set_config({"thread_num": 2})
    llm.load()
    with running(create_app(ServedModel(llm, "qwen3-chat"))) as client:
        reply = client.post("/v1/embeddings", json={"input": "hello"})
        assert reply.status_code == 400
        assert "a chat model" in reply.json()["error"]["message"]
        assert client.get("/v1/models").json()["data"][0]["kind"] == "llm"


def test_mnngpu_embed_prints_the_servers_vectors(server):
    done = subprocess.run([sys.executable, "-m", "mnngpu", "embed", str(FOLDER), "--normalize", "--precision", "high",
                           *[arg for text in TEXTS[:2] for arg in ("-p", text)]],
                          capture_output=True, text=True, check=True)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    served = server.post("/v1/embeddings", json={"input": TEXTS[:2], "encoding_format": "float"}).json()["data"]
    assert [line["text"] for line in lines] == TEXTS[:2]
    for line, item in zip(lines, served):
        np.testing.assert_allclose(line["embedding"], item["embedding"], atol=1e-6)


def test_the_field_table_covers_openais_embeddings_request():
    import typing

    from openai.types import embedding_create_params

    from mnngpu.apps.server.fields import EMBEDDINGS, field_names

    assert field_names(EMBEDDINGS) == set(typing.get_type_hints(embedding_create_params.EmbeddingCreateParams))


def test_served_if_embedding_tells_the_folders_apart():
    from mnngpu.apps.server.embeddings import served_if_embedding

    assert served_if_embedding(FIXTURES / "qwen3_int4_b64", "chat") is None
    served = served_if_embedding(FOLDER, NAME, {"thread_num": 2})
    assert isinstance(served, ServedEmbeddingModel) and served.name == NAME and served.llm.dim == 64
    served.close()
