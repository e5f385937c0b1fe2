"""EmbeddingModel on the CPU: the kinds of folder, bad input, and an independent truth for what MNN's
embedding graph computes (HuggingFace's Qwen3 with every token seeing every other)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from mnngpu.errors import InputError, MnnGpuError, ModelFormatError
from tests.conftest import FIXTURES

RETRIEVAL = FIXTURES.parent / "retrieval"   # the embedding models and rerankers (tools/make_embedding_fixtures.py)

QWEN3_EMBEDDING = RETRIEVAL / "qwen3_embedding"


@pytest.fixture(scope="module")
def model():
    model = mnngpu_llm.create(QWEN3_EMBEDDING / "config.json", embedding_model=True)
    model.set_config({"precision": "high", "thread_num": 2})
    model.load()
    return model


def test_an_llm_folder_is_not_an_embedding_model():
    model = mnngpu_llm.create(FIXTURES / "qwen3_int4_b64", embedding_model=True)
    with pytest.raises(ModelFormatError, match="not an embedding model"):
        model.load()


def test_an_embedding_folder_is_not_a_chat_model():
    with pytest.raises(ModelFormatError, match="embedding model .* create it with embedding_model=True"):
        mnngpu_llm.create(QWEN3_EMBEDDING).load()


@pytest.mark.parametrize("text", ["", None, ["a list"]])
def test_a_text_that_is_no_text_is_refused(model, text):
    with pytest.raises(InputError, match="input"):
        model.txt_embedding(text)


def test_a_text_longer_than_the_limit_is_refused(model):
    limit = model.max_tokens
    with pytest.raises(InputError, match=f"exceed the model's limit of {limit}"):
        model.ids_embedding([1] * (limit + 1))


def test_ids_outside_the_vocabulary_are_refused(model):
    with pytest.raises(InputError, match="outside the vocabulary"):
        model.ids_embedding([model.embedding.vocab_size])


def test_rerank_on_an_embedding_model_says_what_it_is(model):
    with pytest.raises(MnnGpuError, match="embedding model .* not rerank scores"):
        model.rerank("q", ["d"])


def test_many_texts_pack_into_forwards_that_agree_with_one_at_a_time(model):
    texts = [f"The farmer walks {i} times to the river." for i in range(150)]   # > one packed forward
    packed = model.embed(texts)
    for i in (0, 73, 149):
        np.testing.assert_allclose(packed[i], model.txt_embedding(texts[i]).read()[0], atol=1e-4)


def test_the_graph_is_hf_qwen3_attending_both_ways_then_the_last_token(model):
    """MNN feeds this graph a mask of ones, which its attention adds to the scores: no token is hidden.
    HuggingFace's model with an all-zero additive mask is the same function (up to int8 weights)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    hf = transformers.AutoModel.from_pretrained(QWEN3_EMBEDDING / "hf", attn_implementation="eager").eval()
    tok = tokenizers.Tokenizer.from_file(str(QWEN3_EMBEDDING / "hf" / "tokenizer.json"))
    for prompt in json.loads((QWEN3_EMBEDDING / "embedding_reference.json").read_text())["prompts"]:
        rendered = model.apply_chat_template(prompt["text"])
        ids = tok.encode(rendered).ids
        assert ids == model.tokenizer_encode(rendered)
        with torch.no_grad():
            both_ways = torch.zeros(1, 1, len(ids), len(ids))
            truth = hf(torch.tensor([ids]), attention_mask=both_ways).last_hidden_state[0, -1].numpy()
        ours = model.txt_embedding(prompt["text"]).read()[0]
        assert ours @ truth / (np.linalg.norm(ours) * np.linalg.norm(truth)) > 0.999


def test_the_bert_graph_is_hf_bert_cls_pooled_and_unit_length():
    """bge: HuggingFace's BertModel (absolute and token-type embeddings, post-LayerNorm, GELU, every
    token seeing every other), its CLS row scaled to unit length, is what the export computes."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = RETRIEVAL / "bge_embedding"
    model = mnngpu_llm.create(folder, embedding_model=True)
    model.set_config({"precision": "high", "thread_num": 2})
    model.load()
    hf = transformers.AutoModel.from_pretrained(folder / "hf", attn_implementation="eager").eval()
    texts = [prompt["text"] for prompt in json.loads((folder / "embedding_reference.json").read_text())["prompts"]]
    ours = model.embed(texts)
    tok = pytest.importorskip("tokenizers").Tokenizer.from_file(str(folder / "hf" / "tokenizer.json"))
    for text, vector in zip(texts, ours):
        ids = model.prompt_ids(text)
        assert ids == tok.encode(model.apply_chat_template(text)).ids   # WordPiece, as HF's tokenizers encodes
        with torch.no_grad():
            cls = hf(torch.tensor([ids])).last_hidden_state[0, 0].numpy()
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)
        assert vector @ cls / np.linalg.norm(cls) > 0.999


@pytest.mark.parametrize("folder, kind, pooling", [
    (RETRIEVAL / "qwen3_embedding", "embedding", "last token after the final norm, not normalized"),
    (RETRIEVAL / "bge_embedding", "embedding", "CLS token, L2-normalized"),
    (FIXTURES / "qwen3_int4_b64", "llm", None),
], ids=["qwen3_embedding", "bge_embedding", "qwen3_int4_b64"])
def test_inspect_names_the_kind_and_pooling(folder, kind, pooling):
    from mnngpu.apps.inspect import format_inspect_table, inspect_model

    info = inspect_model(folder)
    assert (info["kind"], info["pooling"]) == (kind, pooling)
    assert (info["quant"]["lm_head"] is None) == (kind == "embedding")   # no lm_head: the last linear is a layer's
    assert (f"embedding model: {pooling}" in format_inspect_table(info)) == (kind == "embedding")


def test_mnngpu_embed_refuses_an_llm_folder_and_no_text(capsys):
    from mnngpu.apps.cli import main

    assert main(["embed", str(FIXTURES / "qwen3_int4_b64"), "-p", "hi"]) != 0
    assert "not an embedding model" in capsys.readouterr().err
    assert main(["embed", str(QWEN3_EMBEDDING), "-p", ""]) != 0
    assert "empty string" in capsys.readouterr().err


def test_a_bert_text_longer_than_its_position_table_is_refused():
    """The export takes positions modulo the table's rows (128 here): a longer text would wrap around."""
    model = mnngpu_llm.create(RETRIEVAL / "bge_embedding", embedding_model=True)
    model.load()
    hf_config = json.loads((RETRIEVAL / "bge_embedding" / "hf" / "config.json").read_text())
    assert model.max_tokens == hf_config["max_position_embeddings"] == 128
    model.ids_embedding([5] * 128)
    with pytest.raises(InputError, match="limit of 128 .its position table's rows."):
        model.ids_embedding([5] * 129)
