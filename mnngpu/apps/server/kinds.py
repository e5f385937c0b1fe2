"""What kind of model a served model is (an LLM, an embedding model, a reranker), and the 400 a route
gives a model of another kind than it runs; GET /v1/models says each model's kind."""

from __future__ import annotations

from mnngpu.apps.server.protocol import ApiError

LLM, EMBEDDING, RERANKER = "llm", "embedding", "reranker"
KIND_WORDS = {LLM: "a chat model (LLM)", EMBEDDING: "an embedding model", RERANKER: "a reranker"}
KIND_ROUTES = {LLM: "/v1/chat/completions, /v1/completions, /v1/messages and /v1/responses",
               EMBEDDING: "/v1/embeddings", RERANKER: "/v1/rerank and /rerank"}


def model_kind(served) -> str:
    """LLM for a ServedModel; a served embedding model or reranker says its own."""
    return getattr(served, "kind", LLM)


def require_kind(served, wanted: str) -> None:
    """A 400 naming the model's kind when the route runs another kind."""
    kind = model_kind(served)
    if kind != wanted:
        raise ApiError(400, f"the model '{served.name}' is {KIND_WORDS[kind]}; this route needs {KIND_WORDS[wanted]} "
                            f"(this model answers {KIND_ROUTES[kind]})", param="model", code="wrong_model_kind")


def listing(entry) -> dict:
    """A GET /v1/models entry with the model's `kind` (null until a model that loads on first use has)."""
    return {**entry.listing(), "kind": model_kind(entry.served) if entry.served is not None else None}
