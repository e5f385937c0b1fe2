"""Aggregate tokens per second of continuous batching (mnngpu.generation.batch) at 1, 2 and 4
slots, per backend.

    python -m benchmarks.batch_speed mnngpu/demo/model --backends cpu vulkan --slots 1 2 4 --tokens 32

Each slot count runs as many greedy requests as slots (different prompts of about the same
length), every one for --tokens tokens, through one Batch on one loaded model, after a short
warm-up run of that many slots. `total` is every generated token over the whole run (the prefills included);
`decode` counts only the batched decode forwards (Llm.decode_rows) and their rows. Each row gives
the best of --rounds rounds, since other work on a shared machine only ever slows a round down,
and its ratio to the same backend's 1-slot row. The CPU and the 1-minute load average before and
after are printed: on a shared machine the load decides the figures, so compare only rows
measured in one run. A fixed-shape backend (vulkan, opencl) prefills in chunks of its prefill
module's rows whatever the prompt's length, which weighs on `total` for short replies.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

# Time the compiled kernels, never the numpy stand-ins of a cold kernel cache (mnngpu/jit.py).
os.environ.setdefault("MNNGPU_BACKGROUND_COMPILE", "0")

from benchmarks.machine import cpu_description
from mnngpu import llm as mnngpu_llm
from mnngpu.generation.batch import Batch

QUESTIONS = ("Tell me about crows.", "Why is the sky blue?", "What colour is grass?", "Name a big cat.")


def load(model_dir: Path, backend: str, threads: int):
    model = mnngpu_llm.create(model_dir / "config.json" if model_dir.is_dir() else model_dir)
    model.set_config({"backend_type": backend, "thread_num": threads, "sampler_type": "greedy"})
    model.load()
    return model


def prompts(model, count: int) -> list[list[int]]:
    return [model.tokenizer_encode(model.apply_chat_template([{"role": "user", "content": QUESTIONS[i % 4]}]))
            for i in range(count)]


def one_round(model, slots: int, tokens: int) -> tuple[float, float]:
    """(total tok/s, decode tok/s) of `slots` requests of `tokens` tokens through a Batch of `slots`."""
    model.reset()
    batch = Batch(model, slots=slots)
    decode = {"seconds": 0.0, "rows": 0}
    forward = model.decode_rows

    def timed(sequences, feed):
        start = time.perf_counter()
        try:
            return forward(sequences, feed)
        finally:
            decode["seconds"] += time.perf_counter() - start
            decode["rows"] += len(feed)

    model.decode_rows = timed
    try:
        requests = [batch.submit(ids, max_new_tokens=tokens, stop_ids=()) for ids in prompts(model, slots)]
        start = time.perf_counter()
        batch.run()
        seconds = time.perf_counter() - start
    finally:
        del model.decode_rows
    for request in requests:
        request.wait()
    generated = sum(len(r.tokens) for r in requests)
    return generated / seconds, decode["rows"] / max(decode["seconds"], 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--backends", nargs="+", default=["cpu", "vulkan"])
    parser.add_argument("--slots", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(cpu_description())
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print(f"{'backend':8} {'slots':>5} {'total tok/s':>12} {'x 1 slot':>9} {'decode tok/s':>13} {'x 1 slot':>9}")
    for backend in args.backends:
        model = load(args.model_dir, backend, args.threads)
        first = None
        for slots in args.slots:
            one_round(model, slots, 2)   # warm-up: records the modules of this batch width
            total, decode = (max(values) for values in zip(*(one_round(model, slots, args.tokens)
                                                            for _ in range(args.rounds))))
            first = first or (total, decode)
            print(f"{backend:8} {slots:5d} {total:12.2f} {total / first[0]:8.2f}x {decode:13.2f} "
                  f"{decode / first[1]:8.2f}x", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
