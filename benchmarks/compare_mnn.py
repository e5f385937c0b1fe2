"""mnngpu against MNN's own runtime (`MNN.llm`) on one model folder, side by side.

    python -m benchmarks.compare_mnn bench_models/qwen2_5_0_5b_shape --threads 2 --rounds 3
    python -m benchmarks.compare_mnn bench_models/qwen3_moe_shape --threads 2   # the MoE model
    python -m benchmarks.compare_mnn bench_models/qwen3_5_shape --threads 2     # Gated DeltaNet + attention

Each measurement runs in a fresh process, the engines alternating (mnngpu, MNN, mnngpu, MNN, ...),
so that neither gets a warmer page cache or a quieter machine. A process loads the model with the
folder's own settings (plus thread_num), warms up with one run of the same prompt (as llm_bench drops
its first run; for mnngpu this loads the compiled kernels from numba's cache), then times a prefill
of `--prompt` tokens and `--decode` greedy decode steps after it, both through `forward()` with an
argmax in Python, the same work for both engines. It reports
load time, prefill and decode tok/s, peak RSS after load and at the end, and the ratios mnngpu/MNN.
Decode GB/s is the weight bytes a decode step reads times decode tok/s, next to the machine's read
bandwidth: the whole weight file, or for a MoE model the file less the experts not chosen (both
engines run only the top_k experts on the CPU; `mnngpu inspect` gives the same figure).

`--mnn-memory high` runs MNN at memory high instead of the folder's setting (the exporter writes
low): MNN's memory low quantizes activations to int8 on the CPU, memory high keeps them float,
the accuracy mnngpu's precision-low path is held to (docs/runtime_options.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import cpu_description, read_bandwidth_gbs

# Time the compiled kernels, never the numpy stand-ins of a cold kernel cache (mnngpu/jit.py).
os.environ.setdefault("MNNGPU_BACKGROUND_COMPILE", "0")

ENGINES = ("mnngpu", "mnn")
BENCH_TOKEN = 16


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- one measurement, in its own process -----------------------------------------------------

def _load(engine: str, model_dir: Path, threads: int, mnn_memory: str | None = None):
    if engine == "mnn":
        import MNN.llm as mnn_llm

        llm = mnn_llm.create(str(model_dir / "config.json"))
        llm.set_config({"thread_num": threads, **({"memory": mnn_memory} if mnn_memory else {})})
    else:
        from mnngpu import llm as mnngpu_llm

        llm = mnngpu_llm.create(model_dir)
        llm.set_config({"thread_num": threads})
    llm.load()
    return llm


def _last_logits(logits):
    import numpy as np

    values = np.asarray(logits.read() if hasattr(logits, "read") else logits, dtype=np.float32)
    return values.reshape(-1, values.shape[-1])[-1]


def _prefill_then_decode(llm, prompt: int, decode: int) -> tuple[float, float]:
    import numpy as np

    llm.reset()
    start = time.perf_counter()
    token = int(np.argmax(_last_logits(llm.forward([BENCH_TOKEN] * prompt))))
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(decode):
        token = int(np.argmax(_last_logits(llm.forward([token]))))
    return prefill_s, time.perf_counter() - start


def measure(engine: str, model_dir: Path, threads: int, prompt: int, decode: int, mnn_memory: str | None) -> dict:
    start = time.perf_counter()
    llm = _load(engine, model_dir, threads, mnn_memory)
    load_s = time.perf_counter() - start
    rss_load = peak_rss_mb()
    _prefill_then_decode(llm, prompt, 4)   # warm-up, as llm_bench drops its first run: kernels, first touches
    prefill_s, decode_s = _prefill_then_decode(llm, prompt, decode)
    return {"engine": engine, "load_s": load_s, "prefill_tok_s": prompt / prefill_s,
            "decode_tok_s": decode / decode_s if decode else 0.0, "rss_load_mb": rss_load,
            "rss_peak_mb": peak_rss_mb()}


# ---- the driver ---------------------------------------------------------------------------------

def run_worker(engine: str, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.compare_mnn", str(args.model_dir), "--worker", engine,
                   "--threads", str(args.threads), "--prompt", str(args.prompt), "--decode", str(args.decode),
                   "--json-out", str(out), *(["--mnn-memory", args.mnn_memory] if args.mnn_memory else [])]
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=args.timeout)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"{engine} run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def _summary(values: list[float]) -> str:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:9.2f} ± {std:6.2f}"


METRICS = [("decode_tok_s", "decode tok/s", True), ("prefill_tok_s", "prefill tok/s", True),
           ("load_s", "load s", False), ("rss_load_mb", "peak RSS after load (MB)", False),
           ("rss_peak_mb", "peak RSS (MB)", False)]


def report(results: dict[str, list[dict]], args, weight_bytes: int, bandwidth: float | None) -> str:
    title = (f"model {args.model_dir}  threads {args.threads}  prompt {args.prompt}  decode {args.decode}  "
             f"rounds {args.rounds}  MNN memory {args.mnn_memory or 'as the folder says'}")
    loads = [load for engine in ENGINES for r in results[engine] for load in (r["load_average"],)]
    waiting = os.environ.get("OMP_WAIT_POLICY")
    machine = (f"{cpu_description()}; load average {min(loads):.1f} to {max(loads):.1f} as the processes started"
               + (f"; OMP_WAIT_POLICY={waiting} for both engines" if waiting else ""))
    lines = [title, machine, ""]
    lines.append(f"| {'metric':26s} | {'mnngpu':>18s} | {'MNN':>18s} | {'mnngpu / MNN':>12s} |")
    lines.append(f"| {'-' * 26} | {'-' * 17}: | {'-' * 17}: | {'-' * 11}: |")
    for key, label, higher_is_better in METRICS:
        ours = [r[key] for r in results["mnngpu"]]
        theirs = [r[key] for r in results["mnn"]]
        ratio = statistics.fmean(ours) / statistics.fmean(theirs)
        lines.append(f"| {label:26s} | {_summary(ours):>18s} | {_summary(theirs):>18s} | {ratio:11.2f}x |")
    lines.append("")
    for engine in ENGINES:
        gbs = statistics.fmean(r["decode_tok_s"] for r in results[engine]) * weight_bytes / 1e9
        against = f" of {bandwidth:.1f} GB/s measured read bandwidth ({gbs / bandwidth:.0%})" if bandwidth else ""
        lines.append(f"{engine} decode streams {gbs:.1f} GB/s of weights{against}")
    return "\n".join(lines)


def decode_bytes(model_dir: Path) -> int:
    """The weight bytes one decode step reads: the file, less the experts a MoE model leaves out."""
    from mnngpu.apps.inspect import moe_facts
    from mnngpu.format import read_net

    config = json.loads((model_dir / "config.json").read_text())
    size = os.path.getsize(model_dir / config.get("llm_weight", "llm.mnn.weight"))
    moe = moe_facts(read_net(model_dir / config.get("llm_model", "llm.mnn")), size)
    return size if moe is None else moe["bytes_per_token"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--decode", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="processes per engine, alternating")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per process")
    parser.add_argument("--no-bandwidth", action="store_true", help="skip the read-bandwidth measurement")
    parser.add_argument("--mnn-memory", choices=["low", "normal", "high"],
                        help="MNN's memory setting (default: the folder's); mnngpu keeps the folder's")
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = measure(args.worker, args.model_dir, args.threads, args.prompt, args.decode, args.mnn_memory)
        args.json_out.write_text(json.dumps(result))
        return
    results: dict[str, list[dict]] = {engine: [] for engine in ENGINES}
    for round_index in range(args.rounds):
        for engine in ENGINES:
            load_average = os.getloadavg()[0]
            result = {**run_worker(engine, args), "load_average": load_average}
            results[engine].append(result)
            print(f"round {round_index + 1} {engine:7s} decode {result['decode_tok_s']:7.2f} tok/s  "
                  f"prefill {result['prefill_tok_s']:7.2f} tok/s  load {result['load_s']:5.2f} s  "
                  f"peak RSS {result['rss_peak_mb']:6.0f} MB", flush=True)
    bandwidth = None if args.no_bandwidth else read_bandwidth_gbs(args.threads)
    weight_bytes = decode_bytes(args.model_dir)
    print()
    print(report(results, args, weight_bytes, bandwidth))


if __name__ == "__main__":
    main()
