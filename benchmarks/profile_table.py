"""What the per-kernel profiles share (vulkan_profile.py, cuda_profile.py): the steps they watch,
the whole steps timed as a run makes them, and the table of where a step's time goes."""

from __future__ import annotations

import time

from mnngpu.apps import bench


def prefill_then_decode(model, prompt: int, phase: dict[str, str]) -> None:
    """A prefill of `prompt` tokens, then one decode step; phase["name"] names the one under way."""
    phase["name"] = "prefill"
    model.reset()
    logits = model.forward([bench.BENCH_TOKEN] * prompt)
    phase["name"] = "decode"
    model.forward([int(logits[0, -1].argmax())])


def step_seconds(model, prompt: int, repeats: int, decode_steps: int = 1) -> tuple[float, float]:
    """Best prefill of `prompt` tokens, and best of the `decode_steps` decode steps after it."""
    prefill = decode = float("inf")
    for _ in range(repeats):
        model.reset()
        start = time.perf_counter()
        logits = model.forward([bench.BENCH_TOKEN] * prompt)
        prefill = min(prefill, time.perf_counter() - start)
        token = int(logits[0, -1].argmax())
        for _ in range(decode_steps):
            start = time.perf_counter()
            token = int(model.forward([token])[0, -1].argmax())
            decode = min(decode, time.perf_counter() - start)
    return prefill, decode


def print_table(title: str, what: str, times: dict[str, list[float]], whole: float, top: int) -> None:
    """`times`: seconds of each of the step's `what` ("dispatches", "ops") timed alone, by kind."""
    total = sum(sum(values) for values in times.values())
    print(f"\n{title}: whole step {whole * 1e3:.2f} ms, {what} timed alone sum to {total * 1e3:.2f} ms "
          f"({sum(len(v) for v in times.values())} {what})")
    print(f"| kind | {what} | ms | share |")
    print("| --- | ---: | ---: | ---: |")
    ranked = sorted(times.items(), key=lambda item: -sum(item[1]))
    for label, values in ranked[:top]:
        print(f"| {label} | {len(values)} | {sum(values) * 1e3:.2f} | {sum(values) / total:.0%} |")
    rest = ranked[top:]
    if rest:
        seconds = sum(sum(values) for _, values in rest)
        print(f"| the other {len(rest)} kinds | {sum(len(v) for _, v in rest)} | {seconds * 1e3:.2f} | "
              f"{seconds / total:.0%} |")
