"""Where mnngpu's CUDA time goes, op by op: a prefill chunk and a decode step, each op's launches
timed between two device synchronizations.

    python -m benchmarks.cuda_profile bench_models/qwen2_5_0_5b_shape --prompt 512 --repeats 3

The whole steps are timed first as a run makes them (each module replays its CUDA graph).
Then CUDA graphs are switched off and every op of one prefill and one decode step runs alone,
the stream synchronized before and after it, so the per-op sums include each launch's host
cost and miss the overlap a normal run has. What a step spends outside the ops (the
embedding, the uploads, the logits' download) is the gap between that sum and the whole step,
timed again with graphs off.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.machine import cpu_description
from benchmarks.profile_table import prefill_then_decode, print_table, step_seconds
from mnngpu.apps import bench
from mnngpu.runtime.pipeline import Pipeline


def op_seconds(model, prompt: int) -> dict[str, dict[str, list[float]]]:
    """Seconds of each op's onExecute, synchronized around it, keyed by phase and op type."""
    times: dict[str, dict[str, list[float]]] = {"prefill": defaultdict(list), "decode": defaultdict(list)}
    phase = {"name": "prefill"}
    original = Pipeline.run

    def timed_run(pipeline):
        sync = pipeline.backend.device.synchronize
        for step in pipeline.steps:
            sync()
            start = time.perf_counter()
            step.execution.onExecute(step.inputs, step.outputs)
            sync()
            label = f"{type(step.execution).__name__} {getattr(step.execution.node, 'type', '')}".strip()
            times[phase["name"]][label].append(time.perf_counter() - start)
        pipeline.backend.finish()
        if pipeline.cpu_backup is not pipeline.backend:
            pipeline.cpu_backup.finish()

    Pipeline.run = timed_run
    try:
        prefill_then_decode(model, prompt, phase)
    finally:
        Pipeline.run = original
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precision", default="low", choices=["low", "normal", "high"])
    parser.add_argument("--top", type=int, default=12, help="op kinds listed before the rest")
    args = parser.parse_args()
    model = bench.load_model(bench.RuntimeCase(args.model_dir, "cuda", args.precision, "low", 1))
    step_seconds(model, args.prompt, 1, decode_steps=3)   # warm-up: kernels compiled, graphs captured
    prefill, decode = step_seconds(model, args.prompt, args.repeats, decode_steps=3)
    print(cpu_description())
    print(f"whole steps as a run makes them: prefill({args.prompt}) {prefill * 1e3:.2f} ms, "
          f"decode {decode * 1e3:.2f} ms")
    graphs = model.runtime.backend().graphs
    graphs.enabled = False
    graphs.invalidate()
    ungraphed_prefill, ungraphed_decode = step_seconds(model, args.prompt, args.repeats, decode_steps=3)
    times = op_seconds(model, args.prompt)
    print_table("decode, one token (graphs off)", "ops", times["decode"], ungraphed_decode, args.top)
    print_table(f"prefill, {args.prompt} tokens", "ops", times["prefill"], ungraphed_prefill, args.top)


if __name__ == "__main__":
    main()
