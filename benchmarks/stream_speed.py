"""One stream's decode speed through each way of asking for a reply, against `mnngpu bench`'s tg.

    python -m benchmarks.stream_speed bench_models/qwen2_5_0_5b_shape --threads 2 --tokens 128 --rounds 3

`bench` times only the forwards (llm_bench's tg: a 1-token prompt, then --tokens forwards, the
sampling untimed). The other rows time everything a reply does per token: `Llm.generate` (the
model's sampler, the stop checks), `Llm.response` (the chat template, incremental detokenizing,
writing each piece), `generate_reply` (what `mnngpu run`, `mnngpu chat` and the server run: the
reply's markup and stop ids) and `mnngpu run` itself, in a fresh process, read from the decode
speed it prints. Each round runs every row once, in that order, on one loaded model (the
subprocess loads its own), after one dropped round. The table gives each row's best and median
over the rounds; its ratio to bench and its extra milliseconds per token come from the best
figures, since other work on a shared machine only ever slows a round down. The CPU and the
1-minute load average before and after are printed: on a shared machine the load decides the
figures, so compare only rows measured in one run.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

# Time the compiled kernels, never the numpy stand-ins of a cold kernel cache (mnngpu/jit.py).
os.environ.setdefault("MNNGPU_BACKGROUND_COMPILE", "0")

from benchmarks.machine import cpu_description
from mnngpu.apps import bench
from mnngpu.apps.chat import PromptCache, generate_reply

PROMPT = "Once upon a time"
DECODE_SPEED = re.compile(r"decode speed = ([0-9.]+) tok/s")


def context_speed(model) -> float:
    """Decode tok/s of the model's last generate(): its tokens over the time after the prefill."""
    context = model.context
    return context.gen_seq_len / (context.decode_us / 1e6) if context.decode_us else 0.0


def bench_tg(model, runtime: bench.RuntimeCase, tokens: int) -> float:
    result = bench.BenchResult(runtime, bench.TestCase(0, tokens), "", 0)
    bench.run_test(model, bench.TestCase(0, tokens), 1, result)
    return result.decode_speeds[0]


def through_generate(model, tokens: int) -> float:
    model.reset()
    model.generate([bench.BENCH_TOKEN], tokens, stop_ids=())
    return context_speed(model)


def through_response(model, tokens: int) -> float:
    model.reset()
    model.response(PROMPT, stream=True, max_new_tokens=tokens, out=io.StringIO())
    return context_speed(model)


def through_generate_reply(model, tokens: int) -> float:
    cache = PromptCache(model)
    pieces: list[str] = []
    generate_reply(model, cache, model.apply_chat_template(PROMPT), tokens, on_text=pieces.append)
    speed = context_speed(model)
    cache.clear()
    return speed


def through_run_command(runtime: bench.RuntimeCase, tokens: int) -> float:
    command = [sys.executable, "-m", "mnngpu", "run", str(runtime.model), "-p", PROMPT, "-n", str(tokens),
               "--backend", runtime.backend, "--threads", str(runtime.threads), "--precision", runtime.precision,
               "--config", f"memory={runtime.memory}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = DECODE_SPEED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"mnngpu run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return float(found.group(1))


def measure(rows: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each row's speed per round, after a dropped round (kernel compiles, the subprocess's first
    load, first touch of the weights)."""
    speeds: dict[str, list[float]] = {name: [] for name in rows}
    for round_number in range(rounds + 1):
        for name, row in rows.items():
            speed = row()
            if round_number:
                speeds[name].append(speed)
    return speeds


def print_table(speeds: dict[str, list[float]]) -> None:
    """Best and median per row; the ratio and the extra time per token from the best figures,
    since a shared machine's other work only ever slows a round down."""
    reference = max(speeds["bench tg"])
    print("| path | best tok/s | median tok/s | each round | best / bench tg | ms/token over bench |")
    print("|---|---:|---:|---|---:|---:|")
    for name, values in speeds.items():
        best = max(values)
        rounds = " ".join(f"{v:.1f}" for v in values)
        extra_ms = 1e3 / best - 1e3 / reference
        print(f"| {name} | {best:.1f} | {statistics.median(values):.1f} | {rounds} | {best / reference:.3f} | "
              f"{extra_ms:+.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="model folder or its config.json")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="low", choices=["low", "normal", "high"])
    parser.add_argument("--tokens", type=int, default=128, help="tokens decoded per row and round")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds, after one dropped round")
    args = parser.parse_args()

    runtime = bench.RuntimeCase(args.model, args.backend, args.precision, "low", args.threads)
    model = bench.load_model(runtime)
    rows = {"bench tg": lambda: bench_tg(model, runtime, args.tokens),
            "Llm.generate": lambda: through_generate(model, args.tokens),
            "Llm.response": lambda: through_response(model, args.tokens),
            "generate_reply (run, chat, serve)": lambda: through_generate_reply(model, args.tokens),
            "mnngpu run (own process)": lambda: through_run_command(runtime, args.tokens)}
    print(cpu_description())
    print(f"model {args.model.name}, {args.backend}, {args.threads} threads, precision {args.precision}, "
          f"{args.tokens} tokens, {args.rounds} rounds")
    load_before = os.getloadavg()[0]
    speeds = measure(rows, args.rounds)
    print(f"load average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print_table(speeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
