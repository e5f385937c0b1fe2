"""Many clients at once: `mnngpu serve` against llama.cpp's `llama-server -np N` on the same machine,
in one run, for 1, 2, 4 and 8 concurrent clients.

    python -m benchmarks.serve_load bench_models/qwen2_5_0_5b_shape \\
        --gguf bench_models/qwen2_5_0_5b_shape.q4_0.gguf --llama-cpp WORKDIR
    python -m benchmarks.serve_load                  # the demo model, mnngpu serve only
    python -m benchmarks.serve_load --backend vulkan --prefill-widths 100 --prefill-widths 32,100
    python -m benchmarks.serve_load MODEL --config-variant "" --config-variant int8_activations=true

Each client sends `--requests` streamed greedy /v1/completions one after another, each asking for
`--tokens` new tokens from its own fixed prompt (the prompts differ at their start, so no server
reuses another request's prompt cache). The special tokens (end of turn, end of text...) get a logit
bias of -100 (and llama-server `ignore_eos`), so every reply has the same length; a reply that still
ends early is reported. Per
server and client count it reports:

* aggregate tok/s: every reply's completion tokens over the time from the first request sent to the
  last reply ended;
* time to first token (TTFT): from sending a request to its first streamed text, p50 and p99;
* inter-token latency (ITL): the gaps between a reply's successive streamed pieces, p50 and p99.

Both servers are started and stopped here, one after the other, on free ports of 127.0.0.1, with
the same thread count. With `--shared-prefix` the clients' prompts all start with one ~1,000-token
system text and end with a question of their own (8 clients by default): mnngpu serve runs once with
its prompt cache off and once with `--cache-ram MIB`, llama-server with its prompt cache on, and the
table gives TTFT p50 of the cached run over the uncached one. The warm-up request's system text
differs, so the measured clients find nothing cached when they arrive together.

llama-server runs with `-np N` slots (N: `--parallel`, by default the most
clients); `mnngpu serve` gets `--parallel N` too where its --help lists that flag. llama-server is
`--llama-server PATH`, or found in the build folders of tools/build_llama_cpp.sh's WORKDIR
(`--llama-cpp WORKDIR`); it needs a build with LLAMA_BUILD_SERVER on. The GGUF comes from
tools/bench_model_gguf.py. `--backend` is mnngpu serve's (llama-server stays on the CPU); each
`--prefill-widths W` runs one more mnngpu serve with MNNGPU_PREFILL_WIDTHS=W (the prefill module
widths of a fixed-shape backend, mnngpu/runtime/module_pool.py), and each `--config-variant
K=V,K=V` one more with those `--config` items ("" for none), so they are measured side by side. On a
shared machine the load average decides the figures: it is printed before and after each server's run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx

from benchmarks.compare_llama_cpp import LLAMA_CPP_RUNS, load_average
from benchmarks.machine import cpu_description
from mnngpu.backend.widths import WIDTHS_ENV

# Time the compiled kernels, never the numpy stand-ins of a cold kernel cache (mnngpu/jit.py).
os.environ.setdefault("MNNGPU_BACKGROUND_COMPILE", "0")

PROMPT = "Once upon a time there was a little robot who lived in a quiet town by the sea, and every day it"
# --shared-prefix: about 1,000 tokens on the Qwen tokenizers, then each request's own question
SHARED_SYSTEM = "You answer questions about the farm. " + " ".join(
    f"Rule {i}: the farmer keeps {i} cows in barn {i % 7} and feeds them at {6 + i % 12} o'clock." for i in range(40))
WARM_UP_SYSTEM = "Warm-up. " + SHARED_SYSTEM   # shares no block with SHARED_SYSTEM: its first ids differ
DEFAULT_CACHE_RAM = 1024   # MiB, mnngpu serve --cache-ram in the shared-prefix case
START_S = 600   # a server that is not answering GET /health by then has failed to start


@dataclass
class Reply:
    sent: float
    piece_times: list[float] = field(default_factory=list)
    tokens: int = 0
    text: str = ""

    @property
    def ttft(self) -> float:
        return self.piece_times[0] - self.sent

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.piece_times, self.piece_times[1:])]


@dataclass
class Level:
    """One client count's measurements."""

    clients: int
    replies: list[Reply]
    wall_s: float

    @property
    def tokens(self) -> int:
        return sum(reply.tokens for reply in self.replies)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def timed(self) -> list[Reply]:
        """The replies that streamed text: a token id that the tokenizer cannot show (a random-weight
        model's ids above its small tokenizer's) streams nothing, so it cannot be timed."""
        return [reply for reply in self.replies if reply.piece_times]

    def ttft_ms(self, q: float) -> float:
        return 1000 * percentile([reply.ttft for reply in self.timed], q)

    def itl_ms(self, q: float) -> float:
        return 1000 * percentile([gap for reply in self.timed for gap in reply.gaps], q)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, linearly interpolated (with few values, p99 is close to the largest)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# ---- the servers --------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """A server process on a free port of 127.0.0.1, stopped when the block ends."""

    def __init__(self, name: str, command: list[str], port: int, extra_body: dict, env: dict | None = None):
        self.name, self.command, self.port, self.extra_body = name, command, port, extra_body
        self.env = {**os.environ, **(env or {})}
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> Self:
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"serve_load_{self.name}_", suffix=".log")
        self.process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + START_S
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                failure = f"{self.name} did not start: {' '.join(self.command)}\n{self._log_tail()}"
                self.__exit__()
                raise RuntimeError(failure)
            time.sleep(0.5)
        return self

    def _log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def mnngpu_parallel_flag() -> bool:
    """Whether this mnngpu's `serve` takes --parallel."""
    done = subprocess.run([sys.executable, "-m", "mnngpu", "serve", "--help"], capture_output=True, text=True,
                          check=True)
    return "--parallel" in done.stdout


def mnngpu_server(args, parallel: bool, widths: str | None = None, config: str = "", cache_ram: int = 0) -> Server:
    """mnngpu serve on args.backend; `widths`: its MNNGPU_PREFILL_WIDTHS (None: the default widths);
    `config`: comma-separated KEY=VALUE items for its --config; `cache_ram`: its --cache-ram (0: off)."""
    port = free_port()
    command = [sys.executable, "-m", "mnngpu", "serve", *([str(args.model)] if args.model else []),
               "--port", str(port), "-t", str(args.threads), "--sampler", "greedy", "--quiet",
               "--max-queue", str(max(32, args.requests * max(args.clients)))]
    if args.backend:
        command += ["--backend", args.backend]
    if parallel:
        command += ["--parallel", str(args.parallel)]
    if cache_ram:
        command += ["--cache-ram", str(cache_ram)]
        return Server(f"mnngpu-cache{cache_ram}", command, port, {})
    items = [item for item in config.split(",") if item]
    for item in items:
        command += ["--config", item]
    if widths is None:
        return Server("mnngpu" + "".join(f"-{item}" for item in items), command, port, {})
    return Server(f"mnngpu-w{widths.replace(',', '-')}", command, port, {}, {WIDTHS_ENV: widths})


def mnngpu_servers(args, parallel: bool) -> list[tuple[str, object]]:
    """(name, server maker) for each mnngpu serve run: one per --prefill-widths and --config-variant,
    else one; with --shared-prefix, the prompt cache off and on."""
    if args.shared_prefix:
        return [("mnngpu serve no cache", lambda: mnngpu_server(args, parallel)),
                (f"mnngpu serve --cache-ram {args.cache_ram}",
                 lambda: mnngpu_server(args, parallel, cache_ram=args.cache_ram))]
    if not args.prefill_widths and not args.config_variant:
        return [("mnngpu serve", lambda: mnngpu_server(args, parallel))]
    return ([(f"mnngpu serve widths {widths}", lambda widths=widths: mnngpu_server(args, parallel, widths))
             for widths in args.prefill_widths or []]
            + [(f"mnngpu serve {config or 'defaults'}",
                lambda config=config: mnngpu_server(args, parallel, config=config))
               for config in args.config_variant or []])


def find_llama_server(args) -> Path:
    if args.llama_server:
        return args.llama_server
    cpu_build = LLAMA_CPP_RUNS["cpu"][0]   # the build compare_llama_cpp.py runs on the CPU
    found = [args.llama_cpp / f"build-{cpu_build}" / "bin" / "llama-server",
             *sorted(args.llama_cpp.glob("build-*/bin/llama-server"))]
    for binary in found:
        if binary.is_file():
            return binary
    raise SystemExit(f"no llama-server under {args.llama_cpp}/build-*/bin: build llama.cpp with "
                     "-DLLAMA_BUILD_SERVER=ON (target llama-server), or pass --llama-server")


def llama_server(args) -> Server:
    port = free_port()
    prompt = 1536 if args.shared_prefix else 512
    context = args.parallel * (prompt + args.tokens)   # llama-server splits its context among the slots
    command = [str(find_llama_server(args)), "-m", str(args.gguf), "--host", "127.0.0.1", "--port", str(port),
               "-np", str(args.parallel), "-t", str(args.threads), "-tb", str(args.threads), "-c", str(context),
               "-ngl", "0", "--no-webui"]
    # its prompt cache would let a slot skip the prefill of a prompt it has seen; off, unless the prompts
    # share a start on purpose (--shared-prefix), where it is what mnngpu's --cache-ram is measured against
    return Server("llama-server", command, port, {"ignore_eos": True, "cache_prompt": bool(args.shared_prefix)})


# ---- the clients --------------------------------------------------------------------------------

async def one_reply(client: httpx.AsyncClient, server: Server, prompt: str, body: dict) -> Reply:
    payload = {**body, **server.extra_body, "prompt": prompt, "stream": True,
               "stream_options": {"include_usage": True}}
    reply = Reply(sent=time.perf_counter())
    pieces = 0
    async with client.stream("POST", f"{server.url}/v1/completions", json=payload) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{server.name}: {response.status_code} {(await response.aread()).decode()[:500]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if event.get("choices") and event["choices"][0].get("text"):
                reply.piece_times.append(time.perf_counter())
                reply.text += event["choices"][0]["text"]
                pieces += 1
            if event.get("usage"):
                reply.tokens = event["usage"]["completion_tokens"]
    reply.tokens = reply.tokens or pieces
    return reply


def prompt_text(number: int, args, warm_up: bool = False) -> str:
    if not args.shared_prefix:
        return f"{number}. {PROMPT}"
    return f"{WARM_UP_SYSTEM if warm_up else SHARED_SYSTEM}\n\nQuestion {number}: which barn holds cow {number}?"


async def client_run(client, server: Server, first: int, args, body: dict, warm_up: bool) -> list[Reply]:
    return [await one_reply(client, server, prompt_text(first + i, args, warm_up), body)
            for i in range(args.requests)]


async def level(server: Server, clients: int, args, body: dict, warm_up: bool = False) -> Level:
    # a new connection per request: llama-server (cpp-httplib) closes a kept-alive connection after its
    # 5th request, and a client that sent a 6th on it got "Server disconnected without sending a response"
    limits = httpx.Limits(max_connections=clients + 1, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        start = time.perf_counter()
        runs = await asyncio.gather(*(client_run(client, server, 1000 * (c + 1), args, body, warm_up)
                                      for c in range(clients)))
        wall = time.perf_counter() - start
    return Level(clients, [reply for run in runs for reply in run], wall)


def request_body(args, banned_ids: list[int]) -> dict:
    return {"model": "served", "max_tokens": args.tokens, "temperature": 0,
            "logit_bias": {str(i): -100 for i in banned_ids}}


def special_token_ids(model: Path | None) -> list[int]:
    """The ids of the model's special tokens, every end-of-turn and end-of-text marker among them (the
    GGUF, converted from the same tokenizer, has the same ids)."""
    from mnngpu.apps.commands.common import model_path
    from mnngpu.tokenizer import load_tokenizer

    path = model_path(argparse.Namespace(model=model))
    config_path = path if path.is_file() else path / "config.json"
    config = json.loads(config_path.read_text())
    return sorted(load_tokenizer(config_path.parent, config["tokenizer_file"]).special_ids)


def measure(server: Server, args, body: dict) -> list[Level]:
    asyncio.run(level(server, 1, args, body, warm_up=True))   # first-use costs out of the figures
    results = []
    for clients in args.clients:
        result = asyncio.run(level(server, clients, args, body))
        short = [r.tokens for r in result.replies if r.tokens != args.tokens]
        note = f"  ({len(short)} replies not {args.tokens} tokens long: {short})" if short else ""
        untimed = len(result.replies) - len(result.timed)
        note += f"  ({untimed} replies streamed no text, so no TTFT or ITL)" if untimed else ""
        print(f"{server.name:12s} {clients} clients: {result.tok_s:7.1f} tok/s  TTFT p50 {result.ttft_ms(50):7.1f} "
              f"ms  ITL p50 {result.itl_ms(50):6.1f} ms{note}", flush=True)
        results.append(result)
    return results


# ---- the report ---------------------------------------------------------------------------------

def table(name: str, levels: list[Level]) -> list[str]:
    header = "| clients | tok/s | over 1 client | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | replies |"
    lines = [f"{name}:", "", header, "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    one = next((lv.tok_s for lv in levels if lv.clients == 1), float("nan"))
    for lv in levels:
        scaling = "-" if one != one else f"{lv.tok_s / one:.2f}x"   # no 1-client level measured
        lines.append(f"| {lv.clients} | {lv.tok_s:.1f} | {scaling} | {lv.ttft_ms(50):.0f} | "
                     f"{lv.ttft_ms(99):.0f} | {lv.itl_ms(50):.1f} | {lv.itl_ms(99):.1f} | {len(lv.replies)} |")
    return lines + [""]


def ratio_table(ours: list[Level], theirs: list[Level]) -> list[str]:
    lines = ["mnngpu serve / llama-server (tok/s: above 1 is faster; TTFT and ITL: below 1 is faster):", "",
             "| clients | tok/s | TTFT p50 | ITL p50 | ITL p99 |", "|---:|---:|---:|---:|---:|"]
    for a, b in zip(ours, theirs):
        lines.append(f"| {a.clients} | {a.tok_s / b.tok_s:.2f}x | {a.ttft_ms(50) / b.ttft_ms(50):.2f}x | "
                     f"{a.itl_ms(50) / b.itl_ms(50):.2f}x | {a.itl_ms(99) / b.itl_ms(99):.2f}x |")
    return lines + [""]


def cache_ratio_table(results: dict[str, list[Level]], args) -> list[str]:
    """The shared-prefix case: the cached run over the uncached one, from the same run."""
    off, on = results["mnngpu serve no cache"], results[f"mnngpu serve --cache-ram {args.cache_ram}"]
    lines = ["mnngpu serve --cache-ram over no cache (TTFT: the uncached p50 over the cached one, above 1 is "
             "faster; tok/s: above 1 is faster; greedy replies that differ between the two):", "",
             "| clients | TTFT p50 gain | tok/s ratio | replies differing |", "|---:|---:|---:|---:|"]
    for a, b in zip(on, off):
        differ = sum(x.text != y.text for x, y in zip(a.replies, b.replies))   # the same prompts, in order
        lines.append(f"| {a.clients} | {b.ttft_ms(50) / a.ttft_ms(50):.2f}x | {a.tok_s / b.tok_s:.2f}x | "
                     f"{differ} of {len(a.replies)} |")
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, help="the MNN model folder (default: the demo model)")
    parser.add_argument("--gguf", type=Path, help="the same weights as GGUF Q4_0 (tools/bench_model_gguf.py); "
                                                  "without it only mnngpu serve runs")
    parser.add_argument("--llama-cpp", type=Path, help="tools/build_llama_cpp.sh's WORKDIR")
    parser.add_argument("--llama-server", type=Path, help="the llama-server binary (instead of --llama-cpp)")
    parser.add_argument("--clients", default="1,2,4,8", help="concurrent client counts (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=2, help="requests each client sends (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per reply (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="each server's threads (default: %(default)s)")
    parser.add_argument("--parallel", type=int, help="slots: llama-server's -np, and mnngpu serve's --parallel "
                                                     "where it has it (default: the most clients)")
    parser.add_argument("--backend", help="mnngpu serve's backend (cpu, opencl, vulkan, cuda; default: its own); "
                                          "llama-server runs on the CPU")
    parser.add_argument("--prefill-widths", action="append", metavar="W",
                        help=f"run mnngpu serve with {WIDTHS_ENV}=W (e.g. 100, or 32,100); repeat it to measure "
                             "several side by side")
    parser.add_argument("--config-variant", action="append", metavar="K=V,K=V",
                        help="run mnngpu serve with these --config items (\"\" for none); repeat it to measure "
                             "several side by side")
    parser.add_argument("--shared-prefix", action="store_true",
                        help="every prompt starts with one ~1,000-token system text (see the module's docstring); "
                             "--clients defaults to 8")
    parser.add_argument("--cache-ram", type=int, default=DEFAULT_CACHE_RAM, metavar="MIB",
                        help="mnngpu serve's --cache-ram in the shared-prefix case (default: %(default)s)")
    args = parser.parse_args()
    if args.shared_prefix and args.clients == parser.get_default("clients"):
        args.clients = "8"
    args.clients = [int(c) for c in args.clients.split(",")]
    args.parallel = args.parallel or max(args.clients)
    if args.gguf and not (args.llama_cpp or args.llama_server):
        parser.error("--gguf needs --llama-cpp WORKDIR or --llama-server PATH")
    parallel = mnngpu_parallel_flag()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # a server being measured is stopped too

    print(cpu_description())
    print(f"model {args.model or 'the demo model'} on mnngpu's {args.backend or 'default'} backend"
          + (f" against {args.gguf}" if args.gguf else ""))
    print(f"threads: {args.threads} per server; slots: mnngpu serve "
          f"{f'--parallel {args.parallel}' if parallel else '1 (its serve has no --parallel)'}"
          + (f", llama-server -np {args.parallel}" if args.gguf else ""))
    print(f"{args.requests} requests per client, {args.tokens} new tokens each; the machine has "
          f"{os.cpu_count()} cores and 1-minute load average {load_average():.1f}", flush=True)

    results: dict[str, list[Level]] = {}
    servers = mnngpu_servers(args, parallel)
    if args.gguf:
        servers.append(("llama-server", lambda: llama_server(args)))
    body = request_body(args, special_token_ids(args.model))
    for name, make in servers:
        if name in results:   # a --prefill-widths given again: one more run, beside the first
            runs = sum(other.split(" (run ")[0] == name for other in results)
            name = f"{name} (run {runs + 1})"
        with make() as server:
            results[name] = measure(server, args, body)
        print(f"load average after {name}: {load_average():.1f}", flush=True)

    print()
    for name, levels in results.items():
        print("\n".join(table(name, levels)))
    if args.shared_prefix:
        print("\n".join(cache_ratio_table(results, args)))
    if "llama-server" in results:
        for name, levels in results.items():
            if name != "llama-server":
                print(f"{name}:")
                print("\n".join(ratio_table(levels, results["llama-server"])))


if __name__ == "__main__":
    main()
