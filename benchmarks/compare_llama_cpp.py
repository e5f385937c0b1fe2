"""mnngpu against llama.cpp's llama-bench on the same machine and the same drivers: CPU, Vulkan
(Mesa lavapipe here) and OpenCL (PoCL here), on the bench model (MNN int4 block 64 for mnngpu,
GGUF Q4_0 of the same weights for llama.cpp).

    python -m tools.make_bench_model --hf-out bench_models/qwen2_5_0_5b_shape_hf
    tools/build_llama_cpp.sh WORKDIR vulkan            # and, if it builds, WORKDIR opencl
    python -m tools.bench_model_gguf bench_models/qwen2_5_0_5b_shape_hf WORKDIR
    python -m benchmarks.compare_llama_cpp bench_models/qwen2_5_0_5b_shape \\
        bench_models/qwen2_5_0_5b_shape.q4_0.gguf WORKDIR --backends cpu,vulkan --prompt 512 --decode 128

Both engines run llm_bench's tests, whose definitions are the same in `mnngpu bench` and
`llama-bench`: ppN is N prompt tokens from an empty cache (N / prefill time), tgM is M tokens
decoded one by one after a 1-token prompt (M / their time); each repeats `--rep` times after a
dropped warm-up run. Every measurement is a fresh process, mnngpu's and llama.cpp's alternating
per backend, and the machine's 1-minute load average is printed before and after each, because
on a shared machine that decides the figures. llama.cpp's CPU figures come from the Vulkan build
with `-dev none` (no device: every op on its CPU backend); its GPU figures offload every layer
(`-ngl 99`) to the device. The table adds the CPU, the measured read bandwidth and each
engine's decode GB/s of weights (the weight file's size times decode tok/s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.machine import cpu_description, read_bandwidth_gbs

# Time the compiled kernels, never the numpy stand-ins of a cold kernel cache (mnngpu/jit.py).
os.environ.setdefault("MNNGPU_BACKGROUND_COMPILE", "0")

# llama.cpp build (WORKDIR/build-NAME) and llama-bench device per backend
LLAMA_CPP_RUNS = {"cpu": ("vulkan", ["-dev", "none", "-ngl", "0"]),
                  "vulkan": ("vulkan", ["-dev", "Vulkan0", "-ngl", "99"]),
                  "opencl": ("opencl", ["-dev", "GPUOpenCL", "-ngl", "99"])}


def load_average() -> float:
    return os.getloadavg()[0]


# ---- mnngpu, in its own process -----------------------------------------------------------------

def measure_mnngpu(model_dir: Path, backend: str, threads: int, prompt: int, decode: int, rep: int) -> dict:
    from mnngpu.apps import bench

    runtime = bench.RuntimeCase(model_dir, backend, "low", "low", threads)
    results = bench.run([runtime], bench.test_cases([prompt], [decode], []), rep)
    speeds = {"prefill": results[0].prefill_speeds, "decode": results[1].decode_speeds}
    return {name: [statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0]
            for name, values in speeds.items()} | {"padded_rows": results[0].padded_rows}


def run_mnngpu(backend: str, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.compare_llama_cpp", str(args.model_dir), str(args.gguf),
                   str(args.workdir), "--worker", backend, "--threads", str(args.threads),
                   "--prompt", str(args.prompt), "--decode", str(args.decode), "--rep", str(args.rep),
                   "--json-out", str(out)]
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=args.timeout)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"mnngpu {backend} run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


# ---- llama.cpp's llama-bench --------------------------------------------------------------------

def llama_bench_command(backend: str, args) -> list[str]:
    build, device = LLAMA_CPP_RUNS[backend]
    binary = args.workdir / f"build-{build}" / "bin" / "llama-bench"
    return [str(binary), "-m", str(args.gguf), "-p", str(args.prompt), "-n", str(args.decode),
            "-t", str(args.threads), "-r", str(args.rep), "-o", "json", *device]


def run_llama_cpp(backend: str, args) -> dict:
    command = llama_bench_command(backend, args)
    # llama.cpp's Vulkan backend skips CPU devices such as lavapipe unless they are listed by index
    env = os.environ | {"GGML_VK_VISIBLE_DEVICES": os.environ.get("GGML_VK_VISIBLE_DEVICES", "0")}
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=args.timeout, env=env)
    dropped = [line for line in done.stderr.splitlines() if "unsupported device" in line or "does not support" in line]
    if dropped and backend != "cpu":
        # e.g. its OpenCL backend on a device without cl_khr_fp16: every op would run on its CPU backend
        raise RuntimeError(f"llama.cpp dropped the {backend} device, so it has no {backend} figure:\n"
                           + "\n".join(dropped))
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp {backend} run failed (exit {done.returncode}): {' '.join(command)}\n"
                           f"{done.stderr[-3000:]}")
    rows = json.loads(done.stdout)
    by_test = {"prefill" if row["n_gen"] == 0 else "decode": [row["avg_ts"], row["stddev_ts"]] for row in rows}
    by_test["backends"] = rows[0].get("backends", "")
    by_test["flash_attn"] = rows[0].get("flash_attn", "")
    return by_test


# ---- the table ----------------------------------------------------------------------------------

def _cell(value: list[float]) -> str:
    return f"{value[0]:.2f} ± {value[1]:.2f}"


def report(results: dict, args, bandwidth: float | None, loads: list[float]) -> str:
    mnn_bytes = os.path.getsize(args.model_dir / json.loads((args.model_dir / "config.json").read_text())
                                .get("llm_weight", "llm.mnn.weight"))
    gguf_bytes = os.path.getsize(args.gguf)
    title = (f"model {args.model_dir} ({mnn_bytes / 1e6:.0f} MB of weights) against {args.gguf} "
             f"({gguf_bytes / 1e6:.0f} MB)  threads {args.threads}  rep {args.rep}")
    lines = [title, cpu_description()]
    if bandwidth:
        lines.append(f"measured read bandwidth ({args.threads} threads): {bandwidth:.1f} GB/s")
    lines.append(f"1-minute load average over the runs: {min(loads):.1f} to {max(loads):.1f} "
                 f"(the machine has {os.cpu_count()} cores)")
    lines += ["", "| backend | test | mnngpu tok/s | llama.cpp tok/s | mnngpu / llama.cpp |",
              "| --- | --- | ---: | ---: | ---: |"]
    for backend, (ours, theirs) in results.items():
        for key, test in (("prefill", f"pp{args.prompt}"), ("decode", f"tg{args.decode}")):
            ratio = ours[key][0] / theirs[key][0]
            lines.append(f"| {backend} | {test} | {_cell(ours[key])} | {_cell(theirs[key])} | {ratio:.2f}x |")
    lines.append("")
    for backend, (ours, theirs) in results.items():
        ours_gbs, theirs_gbs = ours["decode"][0] * mnn_bytes / 1e9, theirs["decode"][0] * gguf_bytes / 1e9
        lines.append(f"{backend}: decode streams {ours_gbs:.2f} GB/s of weights (mnngpu), {theirs_gbs:.2f} GB/s "
                     f"(llama.cpp, backends {theirs['backends']}, flash_attn {theirs['flash_attn']})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="the MNN export (tools/make_bench_model.py)")
    parser.add_argument("gguf", type=Path, help="the same weights as GGUF (tools/bench_model_gguf.py)")
    parser.add_argument("workdir", type=Path, help="tools/build_llama_cpp.sh's WORKDIR")
    parser.add_argument("--backends", default="cpu,vulkan", help="comma-separated: cpu, vulkan, opencl")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--decode", type=int, default=128)
    parser.add_argument("--rep", type=int, default=3, help="measured repeats per process")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per process")
    parser.add_argument("--no-bandwidth", action="store_true", help="skip the read-bandwidth measurement")
    parser.add_argument("--worker", choices=sorted(LLAMA_CPP_RUNS), help=argparse.SUPPRESS)
    parser.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.workdir = args.workdir.resolve()
    if args.worker:
        result = measure_mnngpu(args.model_dir, args.worker, args.threads, args.prompt, args.decode, args.rep)
        args.json_out.write_text(json.dumps(result))
        return
    results, loads = {}, [load_average()]
    for backend in args.backends.split(","):
        ours = run_mnngpu(backend, args)
        loads.append(load_average())
        theirs = run_llama_cpp(backend, args)
        loads.append(load_average())
        results[backend] = (ours, theirs)
        for engine, figures in (("mnngpu", ours), ("llama.cpp", theirs)):
            print(f"{backend:7s} {engine:10s} prefill {_cell(figures['prefill'])} tok/s  "
                  f"decode {_cell(figures['decode'])} tok/s", flush=True)
    bandwidth = None if args.no_bandwidth else read_bandwidth_gbs(args.threads)
    print()
    print(report(results, args, bandwidth, loads))


if __name__ == "__main__":
    main()
