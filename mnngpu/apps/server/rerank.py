"""POST /v1/rerank and POST /rerank: a reranker's relevance scores, in the request and reply shape that
llama-server, vLLM and Cohere's v1 rerank API share.

    {"query": "...", "documents": ["...", {"text": "..."}, ...], "top_n": 3, "return_documents": true}
    -> {"id": "rerank-...", "model": name, "results": [{"index": i, "relevance_score": s,
        "document": {"text": "..."}}, ...], "usage": {"prompt_tokens": n, "total_tokens": n}}

The results come most relevant first, `top_n` of them (all by default). A score is what MNN's
Qwen3Reranker computes (mnngpu.engine.reranker): P("yes") for the document. Only a served reranker
answers; any other model gets a 400 naming its kind.
"""

from __future__ import annotations

import uuid

from mnngpu.apps.server.embeddings import MAX_INPUTS
from mnngpu.apps.server.fields import RERANK, refused_field
from mnngpu.apps.server.kinds import RERANKER
from mnngpu.apps.server.protocol import ApiError
from mnngpu.apps.server.served_worker import ServedMetrics, ServedOnThread
from mnngpu.engine.reranker import SUFFIX, Qwen3Reranker, rerank_prefix
from mnngpu.errors import InputError


class ServedReranker(ServedOnThread):
    kind = RERANKER

    def __init__(self, reranker: Qwen3Reranker, name: str, created: int = 0):
        super().__init__(reranker, name, ServedMetrics("rerank", "documents", "Documents scored",
                                                      "Tokens of the prompts scored"), created)

    @classmethod
    def load(cls, path, name: str, overrides: dict | None = None) -> ServedReranker:
        """The Qwen3-Reranker export in folder `path` loaded with `overrides` and served as `name`."""
        reranker = Qwen3Reranker(path)
        reranker.set_config(overrides or {})
        reranker.load()
        return cls(reranker, name, created=int(reranker.llm.config.base_dir.stat().st_mtime))


def _documents(value) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "documents is a non-empty list of strings or {\"text\": ...} objects", param="documents")
    if len(value) > MAX_INPUTS:
        raise ApiError(400, f"{len(value)} documents; at most {MAX_INPUTS} per request", param="documents")
    texts = []
    for index, item in enumerate(value):
        text = item.get("text") if isinstance(item, dict) else item
        if not isinstance(text, str) or not text:
            raise ApiError(400, f"documents[{index}] is a non-empty string or an object with a non-empty text",
                           param="documents")
        texts.append(text)
    return texts


def _top_n(value, count: int) -> int:
    if value is None:
        return count
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ApiError(400, f"top_n is an integer of at least 1, got {value!r}", param="top_n")
    return min(value, count)


def _scores(reranker: Qwen3Reranker, instruct: str, query: str, documents: list[str]) -> tuple[list[float], int]:
    """The scores, and the tokens of the prompts they were computed from."""
    reranker.set_instruct(instruct)
    encode = reranker.llm.tokenizer_encode
    shared = len(encode(rerank_prefix(instruct, query))) + len(encode(SUFFIX))
    tokens = sum(shared + len(encode(document)) for document in documents)
    return reranker.compute_scores(query, documents), tokens


async def create_rerank(served: ServedReranker, body: dict) -> dict:
    """The response body of POST /v1/rerank for `body` (checked: a 400 names a bad field)."""
    refused = refused_field(body, RERANK)
    if refused is not None:
        name, message, code = refused
        raise ApiError(400, message, param=name, code=code)
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise ApiError(400, "query is a non-empty string", param="query")
    documents = _documents(body.get("documents"))
    top_n = _top_n(body.get("top_n"), len(documents))
    instruct = body.get("instruct") or ""
    if not isinstance(instruct, str):
        raise ApiError(400, "instruct is a string", param="instruct")
    try:
        scores, tokens = await served.run(_scores, served.llm, instruct, query, documents)
    except InputError as exc:
        raise ApiError(400, str(exc), param="documents") from None
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]
    served.metrics.record(len(documents), tokens)
    results = [{"index": i, "relevance_score": scores[i],
                **({"document": {"text": documents[i]}} if body.get("return_documents") else {})} for i in order]
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": served.name, "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
