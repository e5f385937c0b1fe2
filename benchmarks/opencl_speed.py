"""Prefill and decode speed of the OpenCL backend (PoCL on a CI machine) on a fixture model and,
when it has been made (tools/make_bench_model.py), the Qwen2.5-0.5B-shaped bench model.

    python benchmarks/opencl_speed.py                                  # fixture + bench model if present
    python benchmarks/opencl_speed.py MODEL_DIR ... [--prompt-len 100] [--decode 32] [--backends opencl cpu]

Per model and backend: load time, the first forward (which resizes the prefill module and builds
the kernels; PoCL caches the builds on disk, so a second run is faster), then the best of
`--repeats` prefills of `--prompt-len` tokens after a reset, and `--decode` greedy decode steps.
The fixed-shape backend pads a prompt to whole chunks of 100 rows, so prompt lengths that are
multiples of 100 show its real throughput.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "models" / "qwen2_int4_b64"
BENCH_MODEL = ROOT / "bench_models" / "qwen2_5_0_5b_shape"


def measure(model_dir: Path, backend: str, prompt_len: int, decode: int, repeats: int) -> dict[str, float]:
    from mnngpu import llm as mnngpu_llm

    start = time.perf_counter()
    model = mnngpu_llm.create(model_dir)
    model.set_config({"backend_type": backend, "precision": "high", "thread_num": 2})
    model.load()
    load_s = time.perf_counter() - start
    ids = [int(i) for i in np.random.default_rng(0).integers(3, min(model.embedding.vocab_size, 1000), prompt_len)]

    start = time.perf_counter()
    model.forward(ids)
    model.forward([ids[0]])          # resizes the decode module
    first_s = time.perf_counter() - start

    prefill_s = float("inf")
    for _ in range(repeats):
        model.reset()
        start = time.perf_counter()
        logits = model.forward(ids)
        prefill_s = min(prefill_s, time.perf_counter() - start)
    token = int(np.asarray(logits)[0, -1].argmax())
    start = time.perf_counter()
    for _ in range(decode):
        token = int(np.asarray(model.forward([token]))[0, -1].argmax())
    decode_s = time.perf_counter() - start
    return {"load_s": load_s, "first_forward_s": first_s, "prefill_tok_s": prompt_len / prefill_s,
            "decode_tok_s": decode / decode_s, "decode_ms": 1e3 * decode_s / decode}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path, help="model folders (default: a fixture and the bench model)")
    parser.add_argument("--backends", nargs="+", default=["opencl"])
    parser.add_argument("--prompt-len", type=int, default=100)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    models = args.models or [FIXTURE] + ([BENCH_MODEL] if (BENCH_MODEL / "config.json").exists() else [])
    print(f"prompt {args.prompt_len} tokens, {args.decode} decode steps, precision high\n")
    print("| model | backend | load s | first forward s | prefill tok/s | decode tok/s | ms/token |")
    print("|---|---|---|---|---|---|---|")
    for model_dir in models:
        for backend in args.backends:
            r = measure(model_dir, backend, args.prompt_len, args.decode, args.repeats)
            print(f"| {model_dir.name} | {backend} | {r['load_s']:.2f} | {r['first_forward_s']:.2f} | "
                  f"{r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.2f} | {r['decode_ms']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
