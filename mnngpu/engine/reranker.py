"""Qwen3Reranker: relevance scores from a Qwen3-Reranker export (an ordinary Qwen3 LLM export), as
MNN's Qwen3Reranker computes them (MNN's source after 3.6.1, llm/reranker.hpp).

    reranker = Qwen3Reranker("Qwen3-Reranker/config.json")
    reranker.load()
    scores = reranker.compute_scores("a query", ["doc one", "doc two"])   # one in [0, 1] per document

Each document's input is a fixed judging prompt, the instruction and the query (the shared prefix),
then the document and a fixed suffix that opens the assistant's turn; each piece is encoded on its
own. The score is softmax over the logits of the first ids of "yes" and "no" at the document's last
position: P(yes). MNN runs all documents in one forward whose mask lets each document see the
prefix and itself causally; that is, by construction, each document's own causal forward after the
prefix, which is what runs here (one forward a document).
"""

from __future__ import annotations

import os

import numpy as np

from mnngpu.config import LlmConfig
from mnngpu.engine.llm import Llm
from mnngpu.errors import InputError

SYSTEM = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
          "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def rerank_prefix(instruct: str, query: str) -> str:
    """The text before a document: the judging prompt, the instruction and the query."""
    return f"{SYSTEM}<Instruct>: {instruct}\n<Query>: {query}\n<Document>: "


class Qwen3Reranker:
    kind = "reranker"

    def __init__(self, config_path: str | os.PathLike):
        self.llm = Llm(LlmConfig.load(config_path))
        self.instruct = ""

    def set_config(self, overrides) -> bool:
        return self.llm.set_config(overrides)

    def load(self) -> None:
        self.llm.load()
        self.yes_id = self.llm.tokenizer_encode("yes")[0]
        self.no_id = self.llm.tokenizer_encode("no")[0]

    def set_instruct(self, instruct: str) -> None:
        self.instruct = instruct

    def compute_scores(self, query: str, documents: list[str]) -> list[float]:
        """P(yes) for each document, in the documents' order."""
        if not isinstance(query, str) or not query:
            raise InputError("a query is a non-empty string", field="query")
        if not documents or not all(isinstance(doc, str) and doc for doc in documents):
            raise InputError("documents are a non-empty list of non-empty strings", field="documents")
        llm = self.llm
        prefix = llm.tokenizer_encode(rerank_prefix(self.instruct, query))
        suffix = llm.tokenizer_encode(SUFFIX)
        scores = []
        for document in documents:
            llm.reset()
            logits = np.asarray(llm.forward(prefix + llm.tokenizer_encode(document) + suffix)).reshape(-1)
            yes, no = float(logits[self.yes_id]), float(logits[self.no_id])
            top = max(yes, no)
            scores.append(float(np.exp(yes - top) / (np.exp(yes - top) + np.exp(no - top))))
        llm.reset()
        return scores

    def rerank(self, query: str, documents: list[str]) -> list[float]:
        return self.compute_scores(query, documents)
