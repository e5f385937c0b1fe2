"""`mnngpu rerank MODEL --query Q DOC...`: a Qwen3-Reranker's relevance score of each document for the
query, as MNN's Qwen3Reranker computes it, one JSON line per document, the most relevant first."""

from __future__ import annotations

import json
import sys

from mnngpu.apps.commands.common import MODEL_HELP, add_runtime_arguments, model_path, overrides_from


def register(subparsers) -> None:
    parser = subparsers.add_parser("rerank", help="score documents for a query with a Qwen3-Reranker export")
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("--query", required=True, help="the query")
    parser.add_argument("documents", nargs="+", metavar="DOC", help="a document to score")
    parser.add_argument("--instruct", default="", help="the instruction the reranker's prompt carries")
    add_runtime_arguments(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from mnngpu.engine.reranker import Qwen3Reranker

    reranker = Qwen3Reranker(model_path(args))
    reranker.set_config(overrides_from(args))
    reranker.load()
    reranker.set_instruct(args.instruct)
    scores = reranker.compute_scores(args.query, args.documents)
    for index in sorted(range(len(scores)), key=lambda i: -scores[i]):
        sys.stdout.write(json.dumps({"index": index, "document": args.documents[index],
                                     "relevance_score": scores[index]}, ensure_ascii=False) + "\n")
    return 0
