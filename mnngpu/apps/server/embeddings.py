"""POST /v1/embeddings: OpenAI's embeddings API over an embedding model (EmbeddingModel).

    {"input": "text" | ["text", ...] | [ids] | [[ids], ...], "encoding_format": "float" | "base64",
     "dimensions": n}
    -> {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}, ...],
        "model": name, "usage": {"prompt_tokens": n, "total_tokens": n}}

Every input runs in packed forwards (EmbeddingModel.embed_ids). A vector comes back unit length,
as OpenAI's do: MNN's raw txt_embedding scaled by its length (a bge export's is unit length
already; a Qwen3-Embedding export's is the final norm's output). `dimensions` keeps the first
`dimensions` values and scales them to unit length again (Matryoshka), for a model whose config
sets `matryoshka` true; any other model refuses it. A server of an LLM refuses this route, and a
server of an embedding model refuses the chat routes, each with a 400 naming the model's kind.
"""

from __future__ import annotations

import base64

import numpy as np

from mnngpu.apps.server.fields import EMBEDDINGS, refused_field
from mnngpu.apps.server.kinds import EMBEDDING
from mnngpu.apps.server.protocol import ApiError
from mnngpu.apps.server.served_worker import ServedMetrics, ServedOnThread
from mnngpu.engine.embedding_model import EmbeddingModel, unit_vectors
from mnngpu.errors import InputError

MAX_INPUTS = 2048   # inputs per request, OpenAI's limit
ENCODINGS = ("float", "base64")


class ServedEmbeddingModel(ServedOnThread):
    kind = EMBEDDING

    def __init__(self, model: EmbeddingModel, name: str, created: int = 0):
        super().__init__(model, name, ServedMetrics("embedding", "inputs", "Inputs embedded",
                                                   "Tokens of the inputs embedded"), created)

    @classmethod
    def load(cls, path, name: str, overrides: dict | None = None) -> ServedEmbeddingModel:
        """The embedding model in folder `path` loaded with `overrides` and served as `name`."""
        from mnngpu import llm as mnngpu_llm

        model = mnngpu_llm.create(path, embedding_model=True)
        model.set_config(overrides or {})
        model.load()
        return cls(model, name, created=int(model.config.base_dir.stat().st_mtime))


def served_if_embedding(path, name: str, overrides: dict | None = None) -> ServedEmbeddingModel | None:
    """The folder `path` loaded and served as `name` when it holds an embedding model; None for any
    other model (what a server's model loader asks before it loads an LLM)."""
    from mnngpu.config import LlmConfig
    from mnngpu.engine.embedding_model import is_embedding_graph
    from mnngpu.format import read_net

    if not is_embedding_graph(read_net(LlmConfig.load(path).model_path)):
        return None
    return ServedEmbeddingModel.load(path, name, overrides)


def _input_ids(served: ServedEmbeddingModel, value) -> list[list[int]]:
    """The token ids of each input: a string gets the model's template (as txt_embedding)."""
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(_is_id(item) for item in value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "input is a string, a list of strings, a list of token ids or a list of token-id lists, "
                            "not empty", param="input")
    if len(value) > MAX_INPUTS:
        raise ApiError(400, f"{len(value)} inputs; at most {MAX_INPUTS} per request", param="input")
    model = served.llm
    ids = []
    for index, item in enumerate(value):
        try:
            if isinstance(item, str):
                ids.append(model.checked_ids(model.prompt_ids(item)))
            elif isinstance(item, list) and item and all(_is_id(token) for token in item):
                ids.append(model.checked_ids(item))
            else:
                raise InputError("expected a string or a non-empty list of token ids", field="input")
        except InputError as exc:
            raise ApiError(400, f"input[{index}]: {str(exc).removeprefix('input: ')}", param="input") from None
    return ids


def _embed(served: ServedEmbeddingModel, value) -> tuple[list[list[int]], np.ndarray]:
    ids = _input_ids(served, value)
    return ids, served.llm.embed_ids(ids)


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _dimensions(served: ServedEmbeddingModel, value) -> int | None:
    if value is None:
        return None
    if not served.llm.config.value("matryoshka"):
        raise ApiError(400, f"the model '{served.name}' does not declare Matryoshka training (config key "
                            "matryoshka), so its vectors cannot be cut to dimensions", param="dimensions")
    dim = served.llm.dim
    if not _is_id(value) or not 1 <= value <= dim:
        raise ApiError(400, f"dimensions is an integer from 1 to {dim}, got {value!r}", param="dimensions")
    return value


def _encoded(vector: np.ndarray, encoding: str):
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(v) for v in vector]


async def create_embeddings(served: ServedEmbeddingModel, body: dict) -> dict:
    """The response body of POST /v1/embeddings for `body` (checked: a 400 names a bad field)."""
    refused = refused_field(body, EMBEDDINGS)
    if refused is not None:
        name, message, code = refused
        raise ApiError(400, message, param=name, code=code)
    if "input" not in body or body["input"] is None:
        raise ApiError(400, "input is required", param="input")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise ApiError(400, f"encoding_format is one of {', '.join(ENCODINGS)}, got {encoding!r}",
                       param="encoding_format")
    dimensions = _dimensions(served, body.get("dimensions"))
    ids, vectors = await served.run(_embed, served, body["input"])   # tokenized off the event loop too
    vectors = unit_vectors(vectors, dimensions)
    tokens = sum(len(item) for item in ids)
    served.metrics.record(len(ids), tokens)
    return {"object": "list", "model": served.name,
            "data": [{"object": "embedding", "index": index, "embedding": _encoded(vector, encoding)}
                     for index, vector in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
