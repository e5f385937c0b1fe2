"""Peak memory of a long context with each runtime option: float KV, kvcache_mmap, use_mmap,
int8 KV (attention_mode 9 and 10), on the CPU backend.

Each case runs in its own process: load the model, prefill `--tokens` ids (in pieces of `--chunk`,
so activations stay small and the KV cache is what grows), decode a few tokens, then print the
process's peak RSS (VmHWM) and its resident anonymous and file-backed memory at the end.

    python -m benchmarks.runtime_options_rss bench_models/qwen2_5_0_5b_shape --tokens 8192
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

CASES = {
    "float KV": {},
    "kvcache_mmap": {"kvcache_mmap": True},
    "use_mmap": {"use_mmap": True},
    "attention_mode 9 (int8 K)": {"attention_mode": 9},
    "attention_mode 10 (int8 K, V)": {"attention_mode": 10},
}

ONE_CASE = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
from mnngpu import llm
folder, tokens, chunk, threads, overrides = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
model = llm.create(folder)
model.set_config({"thread_num": threads, "max_all_tokens": tokens + 64, "chunk": chunk, **overrides})
model.load()
ids = [16 + i % 1000 for i in range(tokens)]
start = time.perf_counter()
model.forward(ids)
prefill = time.perf_counter() - start
for token in (17, 18, 19, 20):
    model.forward([token])
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
kib = lambda key: int(status[key].split()[0])
kv = sum(c.nbytes for c in model.runtime.backend().kv_caches.values())
print("RESULT" + json.dumps({"peak_mib": kib("VmHWM") / 1024, "anon_mib": kib("RssAnon") / 1024,
                             "file_mib": kib("RssFile") / 1024, "kv_mib": kv / 2**20, "prefill_s": prefill}))
"""


def run_case(folder: str, tokens: int, chunk: int, threads: int, overrides: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", ONE_CASE, folder, str(tokens), str(chunk), str(threads),
                           json.dumps(overrides)], capture_output=True, text=True, check=False)
    line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT")), None)
    if line is None:
        raise SystemExit(f"case {overrides} failed:\n{done.stderr[-2000:]}")
    return json.loads(line[len("RESULT"):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(f"{args.model}: {args.tokens} tokens of context, prefill in pieces of {args.chunk}, {args.threads} threads")
    print("| case | peak RSS (MiB) | anon at end | file-backed at end | KV cache (MiB) | prefill (s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as scratch:
        for name, overrides in CASES.items():
            if any(key.endswith("mmap") for key in overrides):
                overrides = {**overrides, "tmp_path": scratch}
            r = run_case(args.model, args.tokens, args.chunk, args.threads, overrides)
            print(f"| {name} | {r['peak_mib']:.0f} | {r['anon_mib']:.0f} | {r['file_mib']:.0f} | {r['kv_mib']:.0f} | "
                  f"{r['prefill_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
