"""What `int8_activations` buys and costs on the CPU: the int4 layers' activations in int8 against
the default int16, side by side on one loaded model each.

    python -m benchmarks.int8_activations bench_models/qwen2_5_0_5b_shape --rounds 3

Speed: a prefill of --prompt ids, and one batched decode step (Llm.decode_rows) of 1, 4 and 8
sequences, each the best of --rounds rounds that alternate between the two models (a shared
machine only ever slows a round down). Cost: the first-step logits of the same prompt and of
--steps teacher-forced decode steps after it, against the model at precision high (exact float32
arithmetic on the int4 weights): the largest difference and the RMS, in units of the logits' std,
and whether the argmax agrees. The CPU and the load average are printed: compare only figures of
one run.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

# Time the compiled kernels, never the numpy stand-ins of a cold kernel cache (mnngpu/jit.py).
os.environ.setdefault("MNNGPU_BACKGROUND_COMPILE", "0")

import numpy as np

from benchmarks.machine import cpu_description
from mnngpu import llm as mnngpu_llm

VARIANTS = {"int16": {"precision": "low"}, "int8": {"precision": "low", "int8_activations": True},
            "exact": {"precision": "high"}}
FIRST_ID = 1000   # the prompt's ids: FIRST_ID, FIRST_ID + 1, ...; the decode rows feed FIRST_ID


def load(model_dir: Path, settings: dict, threads: int):
    model = mnngpu_llm.create(model_dir / "config.json" if model_dir.is_dir() else model_dir)
    model.set_config({"backend_type": "cpu", "thread_num": threads, "sampler_type": "greedy", **settings})
    model.load()
    return model


def sequences(model, count: int, prompt: list[int]) -> list:
    made = []
    for _ in range(count):
        made.append(model.new_sequence())
        model.use_sequence(made[-1])
        model.forward(prompt)
    return made


def timings(model, rows: list, prompt: list[int]) -> dict[str, float]:
    """Seconds of one prefill of `prompt` and of a batched decode step of 1, 4 and 8 sequences."""
    model.use_sequence(rows[0])
    model.reset()
    start = time.perf_counter()
    model.forward(prompt)
    found = {f"prefill {len(prompt)}": time.perf_counter() - start}
    for count in (1, 4, 8):
        start = time.perf_counter()
        for _ in range(3):
            model.decode_rows(rows[:count], [FIRST_ID] * count)
        found[f"decode {count} rows"] = (time.perf_counter() - start) / 3
    return found


def logits_rows(model, prompt: list[int], steps: int) -> np.ndarray:
    """The first-step logits of `prompt`, then of `steps` decode steps feeding FIRST_ID + step."""
    model.use_sequence(model.new_sequence())
    rows = [np.asarray(model.forward(prompt), dtype=np.float64)[0, -1]]
    for step in range(steps):
        rows.append(np.asarray(model.forward([FIRST_ID + step]), dtype=np.float64)[0, -1])
    return np.stack(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--prompt", type=int, default=54, help="prefill ids (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=5, help="decode steps compared (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(cpu_description())
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    prompt = list(range(FIRST_ID, FIRST_ID + args.prompt))
    models = {name: load(args.model_dir, settings, args.threads) for name, settings in VARIANTS.items()}
    exact = logits_rows(models.pop("exact"), prompt, args.steps)
    for name, model in models.items():
        got = logits_rows(model, prompt, args.steps)
        std = exact.std(axis=1)
        worst = (np.abs(got - exact).max(axis=1) / std).max()
        rms = (np.sqrt(((got - exact) ** 2).mean(axis=1)) / std).max()
        agree = int((got.argmax(axis=1) == exact.argmax(axis=1)).sum())
        print(f"{name}: logits vs precision high over {len(exact)} steps: max {worst:.3f} std, RMS {rms:.3f} std, "
              f"argmax agrees {agree}/{len(exact)}")
    rows = {name: sequences(model, 8, prompt) for name, model in models.items()}
    best: dict[tuple[str, str], float] = {}
    for _ in range(args.rounds):
        for name, model in models.items():
            for what, seconds in timings(model, rows[name], prompt).items():
                best[(name, what)] = min(best.get((name, what), float("inf")), seconds)
    print(f"{'':18} {'int16 ms':>9} {'int8 ms':>9} {'int16 / int8':>13}")
    for what in dict.fromkeys(what for _, what in best):
        slow, fast = best[("int16", what)], best[("int8", what)]
        print(f"{what:18} {slow * 1e3:9.2f} {fast * 1e3:9.2f} {slow / fast:12.2f}x")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
