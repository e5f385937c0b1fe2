"""Embeddings per second: mnngpu against MNN's own `txt_embedding` on a bge-small-shaped export
(12 layers, hidden 384, 12 heads, intermediate 1536) made by the real exporter.

    MNNGPU_TF4_PYTHON=~/venvs/tf4/bin/python python -m benchmarks.embedding_speed bench_models/bge_small_shape --build
    python -m benchmarks.embedding_speed bench_models/bge_small_shape --threads 2 --rounds 3

--build makes the export first (random weights, the tiny WordPiece tokenizer of
tools/make_embedding_fixtures.py, int8 in blocks of 64), which needs a transformers-4 Python
(MNNGPU_TF4_PYTHON, see that tool). Sentences of about 30 tokens are embedded in batches of 1 and
32: mnngpu embeds a batch in one packed forward (EmbeddingModel.embed), MNN has no batched call
and runs txt_embedding once per sentence. Each measurement runs in a fresh process, the engines
alternating, each warmed up by one batch first; the best of --rounds is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import cpu_description

os.environ.setdefault("MNNGPU_BACKGROUND_COMPILE", "0")

ENGINES = ("mnngpu", "mnn")
BATCHES = (1, 32)
BGE_SMALL = {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 12, "num_attention_heads": 12,
             "max_position_embeddings": 512, "initializer_range": 0.02}


def sentences(count: int) -> list[str]:
    """`count` sentences of about 30 tokens of the tiny WordPiece tokenizer."""
    from tools import corpus

    words = " ".join(corpus.sentences(count * 4, seed=5, extras=False)).split()
    return [" ".join(words[i * 22: (i + 1) * 22]) for i in range(count)]


def build(dest: Path) -> None:
    import torch
    import transformers

    from tools.make_embedding_fixtures import build_wordpiece_tokenizer, export_tf4
    from tools.mnn_export import copy_model_files

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, out_dir = Path(tmp) / "bge-small-shape", Path(tmp) / "out"
        tok = build_wordpiece_tokenizer(hf_dir)
        torch.manual_seed(0)
        config = transformers.AutoConfig.for_model("bert", vocab_size=tok.get_vocab_size(), **BGE_SMALL)
        transformers.AutoModel.from_config(config).save_pretrained(hf_dir)
        export_tf4(hf_dir, out_dir, "--quant_bit", "8", "--quant_block", "64")
        copy_model_files(out_dir, dest)


def measure(engine: str, model_dir: Path, threads: int, batch: int) -> dict:
    """One measurement (run in its own process): load, one warm-up batch, one timed batch."""
    texts = sentences(batch)
    if engine == "mnn":
        import MNN.llm as mnn_llm

        model = mnn_llm.create(str(model_dir / "config.json"), embedding_model=True)
        model.set_config({"thread_num": threads, "precision": "high", "memory": "high"})
        model.load()

        def run():
            return [model.txt_embedding(text).read() for text in texts]
    else:
        from mnngpu import llm as mnngpu_llm

        model = mnngpu_llm.create(model_dir, embedding_model=True)
        model.set_config({"thread_num": threads, "precision": "high"})
        model.load()
        tokens = sum(len(model.prompt_ids(text)) for text in texts)

        def run():
            return model.embed(texts)
    run()
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    result = {"engine": engine, "batch": batch, "seconds": seconds, "per_second": batch / seconds}
    if engine == "mnngpu":
        result["tokens_per_text"] = tokens / batch
    return result


def in_child(engine: str, model_dir: Path, threads: int, batch: int) -> dict:
    done = subprocess.run([sys.executable, "-m", "benchmarks.embedding_speed", str(model_dir), "--child", engine,
                           "--threads", str(threads), "--batch", str(batch)], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--build", action="store_true", help="make the bge-small-shaped export first")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.model_dir, args.threads, args.batch)), flush=True)
        os._exit(0)   # MNN crashes when its embedding model is destroyed
    if args.build:
        build(args.model_dir)
    print(cpu_description())
    print(f"{'batch':>5}  {'mnngpu emb/s':>12}  {'MNN emb/s':>10}  {'mnngpu/MNN':>10}")
    for batch in BATCHES:
        best = {engine: 0.0 for engine in ENGINES}
        for _ in range(args.rounds):
            for engine in ENGINES:
                best[engine] = max(best[engine], in_child(engine, args.model_dir, args.threads, batch)["per_second"])
        print(f"{batch:>5}  {best['mnngpu']:>12.1f}  {best['mnn']:>10.1f}  {best['mnngpu'] / best['mnn']:>10.2f}x")


if __name__ == "__main__":
    main()
