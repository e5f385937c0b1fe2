"""Prefill and decode speed of any backends on a fixture model and, when it has been made
(tools/make_bench_model.py), the Qwen2.5-0.5B-shaped bench model.

    python -m benchmarks.backend_speed                     # opencl + vulkan, fixture + bench model
    python -m benchmarks.backend_speed MODEL_DIR ... [--backends cpu opencl] [--precisions high low]
        [--prompt-len 100] [--decode 16]

Per model, backend and precision: load time; the first prefill and decode, which resize the two
pool modules (and build kernels or record command buffers); then the best of `--repeats`
prefills of `--prompt-len` tokens after a reset, and `--decode` greedy steps after it.
Fixed-shape backends run prompts in chunks of 100 rows (the last one padded), so multiples of
100 show their real prefill rate. `mnngpu bench` gives llm_bench's table for the same runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.machine import cpu_description

# Time the compiled kernels, never the numpy stand-ins of a cold kernel cache (mnngpu/jit.py).
os.environ.setdefault("MNNGPU_BACKGROUND_COMPILE", "0")
ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "models" / "qwen2_int4_b64"
BENCH_MODEL = ROOT / "bench_models" / "qwen2_5_0_5b_shape"


def seconds(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def load(model_dir: Path, backend: str, precision: str):
    from mnngpu import llm as mnngpu_llm

    model = mnngpu_llm.create(model_dir)
    model.set_config({"backend_type": backend, "precision": precision, "thread_num": 2})
    model.load()
    return model


def greedy_steps(model, token: int, steps: int) -> None:
    for _ in range(steps):
        token = int(np.asarray(model.forward([token]))[0, -1].argmax())


def run(model_dir: Path, backend: str, precision: str, prompt_len: int, decode: int,
        repeats: int) -> dict[str, float]:
    holder = {}
    load_s = seconds(lambda: holder.setdefault("model", load(model_dir, backend, precision)))
    model = holder["model"]
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(3, min(model.embedding.vocab_size, 1000), prompt_len)]
    resize_s = seconds(lambda: (model.forward(ids), model.forward([ids[-1]])))
    prefill_s = min(seconds(lambda: (model.reset(), model.forward(ids))) for _ in range(repeats))
    decode_s = seconds(lambda: greedy_steps(model, ids[-1], decode))
    return {"load": load_s, "resize": resize_s, "prefill": prompt_len / prefill_s, "decode": decode / decode_s,
            "ms": 1e3 * decode_s / decode}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path, help="model folders (default: a fixture and the bench model)")
    parser.add_argument("--backends", nargs="+", default=["opencl", "vulkan"])
    parser.add_argument("--precisions", nargs="+", default=["high", "low"], choices=["high", "normal", "low"])
    parser.add_argument("--prompt-len", type=int, default=100)
    parser.add_argument("--decode", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    models = args.models or [FIXTURE] + ([BENCH_MODEL] if (BENCH_MODEL / "config.json").exists() else [])
    print(f"prompt {args.prompt_len} tokens, {args.decode} decode steps")
    print(cpu_description() + "\n")
    print("| model | backend | precision | load s | first prefill+decode s | prefill tok/s | decode tok/s | ms/token |")
    print("|---|---|---|---|---|---|---|---|")
    for model_dir in models:
        for backend in args.backends:
            for precision in args.precisions:
                r = run(model_dir, backend, precision, args.prompt_len, args.decode, args.repeats)
                print(f"| {model_dir.name} | {backend} | {precision} | {r['load']:.2f} | {r['resize']:.2f} | "
                      f"{r['prefill']:.1f} | {r['decode']:.2f} | {r['ms']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
