"""`mnngpu embed MODEL [-p TEXT ...]`: an embedding model's vector for each text, one JSON line each.

The texts are the -p arguments, else the lines of stdin (empty lines skipped); all of them run in
packed forwards (EmbeddingModel.embed). A vector is what MNN's txt_embedding gives, unless
--normalize makes it unit length, as POST /v1/embeddings returns it.
"""

from __future__ import annotations

import json
import sys

from mnngpu.apps.commands.common import MODEL_HELP, add_runtime_arguments, model_path, overrides_from
from mnngpu.errors import InputError


def register(subparsers) -> None:
    parser = subparsers.add_parser("embed", help="print an embedding model's vectors as JSON lines")
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("-p", "--prompt", action="append", default=[], metavar="TEXT",
                        help="a text to embed (repeatable); without any, each line of stdin")
    parser.add_argument("--normalize", action="store_true", help="unit-length vectors (as /v1/embeddings)")
    add_runtime_arguments(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from mnngpu import llm as mnngpu_llm
    from mnngpu.engine.embedding_model import unit_vectors

    texts = args.prompt or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise InputError("no text to embed: give -p TEXT or lines on stdin", field="prompt")
    model = mnngpu_llm.create(model_path(args), embedding_model=True)
    model.set_config(overrides_from(args))
    model.load()
    vectors = model.embed(texts)
    if args.normalize:
        vectors = unit_vectors(vectors)
    for text, vector in zip(texts, vectors):
        sys.stdout.write(json.dumps({"text": text, "embedding": [float(v) for v in vector]}) + "\n")
    return 0
