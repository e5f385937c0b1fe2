"""The public face of mnngpu, a drop-in for `MNN.llm`: create() picks the model class for a config.

    from mnngpu import llm
    model = llm.create("model_dir/config.json")   # an Llm, or an Omni for a vision/audio model
    model.set_config('{"backend_type": "cpu"}')
    model.load()
    print(model.response("hello"))

The engine itself lives in mnngpu.engine and the multimodal models in mnngpu.omni; the names
users reach for are re-exported here.
"""

from __future__ import annotations

import os

from mnngpu.config import LlmConfig
from mnngpu.engine import Llm, LlmContext, Logits, graph_feeds
from mnngpu.engine.embedding_model import EmbeddingModel
from mnngpu.engine.reranker import Qwen3Reranker
from mnngpu.omni import Omni, is_omni


def create(config_path: str | os.PathLike, embedding_model: bool = False) -> Llm | EmbeddingModel:
    """An Llm for a model folder or its config.json (not loaded yet): an Omni when the config has
    vision, audio or a talker, as MNN's createLLM decides; with embedding_model, an EmbeddingModel
    (MNN's Embedding: txt_embedding), as MNN.llm.create(path, embedding_model=True) gives."""
    config = LlmConfig.load(config_path)
    if embedding_model:
        return EmbeddingModel(config)
    return Omni(config) if is_omni(config) else Llm(config)


__all__ = ["EmbeddingModel", "Llm", "Qwen3Reranker", "LlmContext", "Logits", "create", "graph_feeds"]
