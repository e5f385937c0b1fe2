"""Where mnngpu's Vulkan time goes, kernel by kernel: every dispatch of a decode step and of a
prefill chunk, timed alone.

    python -m benchmarks.vulkan_profile bench_models/qwen2_5_0_5b_shape --prompt 100 --repeats 3

The Vulkan backend records a whole step into one command buffer, so a normal run has no time per
op. This loads the model on the vulkan backend and runs a prefill of `--prompt` tokens and one
decode step, capturing the recorded segments each step submits.
Then each dispatch is recorded alone into a command buffer of its own and submitted `--repeats`
times (the best counts). A lone submit also pays the submit and the fence wait, measured on an
empty command buffer and subtracted. The per-kernel sums print next to the whole step's time;
the KV length the attention kernels see is the one the last forward left (prompt + 1).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.machine import cpu_description
from benchmarks.profile_table import prefill_then_decode, print_table, step_seconds
from mnngpu.apps import bench
from mnngpu.backends.vulkan import VulkanBackend
from mnngpu.backends.vulkan.program import CommandSegment


def capture_dispatches(model, prompt: int) -> dict[str, list]:
    """The dispatches a prefill and a decode step submit (the segments each step marks due),
    with the backend they belong to."""
    captured: dict[str, list] = {"prefill": [], "decode": []}
    phase = {"name": "prefill"}
    original = VulkanBackend._enqueue

    def enqueue(backend, segment):
        if segment not in {s for _, s in captured[phase["name"]]}:
            captured[phase["name"]].append((backend, segment))
        return original(backend, segment)

    VulkanBackend._enqueue = enqueue
    try:
        prefill_then_decode(model, prompt, phase)
    finally:
        VulkanBackend._enqueue = original
    return {name: [(backend, d) for backend, segment in found for d in segment.dispatches]
            for name, found in captured.items()}


def best_submit_seconds(backend, segment: CommandSegment, repeats: int) -> float:
    segment.record(backend.device, backend.command_pool, backend.descriptors)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        backend.device.submit([segment.command_buffer])
        best = min(best, time.perf_counter() - start)
    return best


def dispatch_seconds(dispatches: list, repeats: int) -> dict[str, list[float]]:
    """Seconds per dispatch, less a lone submit's own cost, keyed by kernel name and grid."""
    backend = dispatches[0][0]
    overhead = best_submit_seconds(backend, CommandSegment(), repeats * 4)
    times: dict[str, list[float]] = defaultdict(list)
    for _, dispatch in dispatches:
        segment = CommandSegment()
        segment.add(dispatch)
        seconds = best_submit_seconds(backend, segment, repeats) - overhead
        times[f"{dispatch.kernel.name} groups {dispatch.groups}"].append(max(seconds, 0.0))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--prompt", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=12, help="kernel kinds listed before the rest")
    args = parser.parse_args()
    model = bench.load_model(bench.RuntimeCase(args.model_dir, "vulkan", "low", "low", args.threads))
    captured = capture_dispatches(model, args.prompt)
    prefill, decode = step_seconds(model, args.prompt, args.repeats)
    print(cpu_description())
    print_table("decode, one token", "dispatches", dispatch_seconds(captured["decode"], args.repeats), decode,
                args.top)
    print_table(f"prefill, {args.prompt} tokens", "dispatches", dispatch_seconds(captured["prefill"], args.repeats),
                prefill, args.top)


if __name__ == "__main__":
    main()
