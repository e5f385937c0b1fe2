"""A soak: N clients for M minutes of mixed requests against one `mnngpu serve`, started here.

    python -m benchmarks.soak                                   # the demo model, 8 clients, 5 minutes
    python -m benchmarks.soak MODEL --clients 8 --minutes 20 --json soak.json
    python -m benchmarks.soak --minutes 1 --clients 4           # the version CI runs

Each client sends one request after another, each of a kind drawn at random (seeded per client):
greedy chat completions, streamed completions, n = 2 completions, structured output (a
json_schema response_format), Anthropic's /v1/messages and OpenAI's /v1/responses (streamed or
not), a stream cancelled after its first events, a request whose client hangs up before the reply,
and bad bodies (not JSON, an unknown field, a wrong type, nested too deep). Before the clients
start, every greedy request is sent once alone and its reply recorded: each greedy reply the soak
completes must equal that solo reply, token for token in its text, whatever ran beside it. A bad
body must get a 4xx. Every 5xx is counted, as is every reply that differs from its solo reply.

Every `--sample-s` seconds it records the server's resident memory (VmRSS of its process) and,
from GET /metrics, the busy slots, the waiting requests and the tokens the KV caches hold. After
the clients stop, the slots must all be free again within a few seconds. The summary gives the
counts by kind, RSS at the end of the warm-up (the first `--warm-up` fraction of the run) and at
the end, the growth between them, and the peaks; `--json PATH` writes it as JSON too. The exit
status is 1 when any 5xx, mismatched reply, unexpected status or client error was seen, or the
slots did not come free.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.machine import cpu_description
from benchmarks.serve_load import Server, free_port

MAX_TOKENS = 24
QUESTIONS = ["What colour is a crow?", "Tell me about the sea.", "Where does the farmer walk?",
             "Name three fruits.", "Why is the sky blue?", "Say hello to the robot."]
PROMPTS = ["Once upon a time", "The little robot", "In a quiet town by the sea", "hello"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
BAD_BODIES = [b"{not json", json.dumps({"messages": [{"role": "user", "content": "hi"}], "colour": 1}).encode(),
              json.dumps({"messages": "hi"}).encode(), b'{"messages": ' + b"[" * 200 + b"]" * 200 + b"}"]
FREE_SLOTS_S = 30   # after the clients stop, the slots must be free again within this


def chat(question: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": question}], "max_tokens": MAX_TOKENS, "temperature": 0,
            **extra}


# ---- the greedy requests: (name, path, body, streamed) -> reply text --------------------------------------

def greedy_cases() -> list[tuple[str, str, dict]]:
    """Every greedy request a client may send; each has one right reply, its solo reply."""
    cases = []
    for i, question in enumerate(QUESTIONS):
        cases += [(f"chat{i}", "/v1/chat/completions", chat(question)),
                  (f"chat-stream{i}", "/v1/chat/completions", chat(question, stream=True)),
                  (f"messages{i}", "/v1/messages", {"messages": [{"role": "user", "content": question}],
                                                    "max_tokens": MAX_TOKENS, "temperature": 0}),
                  (f"responses{i}", "/v1/responses", {"input": question, "max_output_tokens": MAX_TOKENS,
                                                      "temperature": 0, "store": i % 2 == 0}),
                  (f"json{i}", "/v1/chat/completions", chat(question, response_format={
                      "type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}))]
    for i, prompt in enumerate(PROMPTS):
        cases += [(f"completion-stream{i}", "/v1/completions",
                   {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}),
                  (f"n2-completion{i}", "/v1/completions",
                   {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "n": 2})]
    return cases


def reply_text(path: str, response: httpx.Response, streamed: bool) -> list[str]:
    """The reply's text per choice (a streamed reply's pieces joined)."""
    if streamed:
        return streamed_text(response)
    response.read()
    body = response.json()
    if path == "/v1/messages":
        return ["".join(block["text"] for block in body["content"] if block["type"] == "text")]
    if path == "/v1/responses":
        return ["".join(part["text"] for item in body["output"] if item["type"] == "message"
                        for part in item["content"] if part["type"] == "output_text")]
    return [choice["message"]["content"] if "message" in choice else choice["text"] for choice in body["choices"]]


def streamed_text(response: httpx.Response) -> list[str]:
    texts: dict[int, str] = {}
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: "):])
        if "error" in event:
            raise StreamFailed(json.dumps(event["error"]))
        for choice in event.get("choices", []):
            piece = choice["delta"].get("content") if "delta" in choice else choice.get("text")
            texts[choice["index"]] = texts.get(choice["index"], "") + (piece or "")
    return [texts[i] for i in sorted(texts)]


class StreamFailed(Exception):
    """A stream that ended with an error event (its status line had gone out as 200)."""


# ---- the run ----------------------------------------------------------------------------------------------

@dataclass
class Tally:
    """What the clients saw, shared by them."""

    counts: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, what: str, failure: str | None = None) -> None:
        with self.lock:
            self.counts[what] += 1
            if failure is not None and len(self.failures) < 50:
                self.failures.append(failure)


class Client(threading.Thread):
    KINDS = ["greedy"] * 6 + ["cancel", "disconnect", "bad"]

    def __init__(self, number: int, url: str, solo: dict, until: float, tally: Tally):
        super().__init__(name=f"soak-client-{number}", daemon=True)
        self.rng = random.Random(number)
        self.url, self.solo, self.until, self.tally = url, solo, until, tally
        self.cases = greedy_cases()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=600) as http:
            while time.monotonic() < self.until:
                kind = self.rng.choice(self.KINDS)
                try:
                    getattr(self, kind)(http)
                except Exception as exc:  # noqa: BLE001 (counted and reported: the soak goes on)
                    self.tally.add("client-error", f"{kind}: {exc!r}")

    def _status(self, what: str, response: httpx.Response) -> bool:
        """Whether the status is 200; a 5xx or any other unexpected status is counted as such."""
        if response.status_code == 200:
            return True
        response.read()
        label = "5xx" if response.status_code >= 500 else "unexpected-status"
        self.tally.add(label, f"{what}: {response.status_code} {response.text[:300]}")
        return False

    def greedy(self, http: httpx.Client, case: tuple[str, str, dict] | None = None) -> None:
        name, path, body = case or self.rng.choice(self.cases)
        streamed = bool(body.get("stream"))
        with http.stream("POST", path, json=body) as response:
            if not self._status(name, response):
                return
            try:
                texts = reply_text(path, response, streamed)
            except StreamFailed as exc:
                self.tally.add("5xx", f"{name}: the stream ended with an error: {exc}")
                return
        if texts == self.solo[name]:
            self.tally.add(f"ok:{name.rstrip('0123456789-')}")
        else:
            self.tally.add("mismatch", f"{name}: {texts!r} != solo {self.solo[name]!r}")

    def cancel(self, http: httpx.Client) -> None:
        """A stream read for a few events, then closed: the server must stop its job."""
        body = chat(self.rng.choice(QUESTIONS), stream=True, max_tokens=200)
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            if self._status("cancel", response):
                for number, _ in enumerate(response.iter_lines()):
                    if number >= 3:
                        break
        self.tally.add("cancelled")

    def disconnect(self, http: httpx.Client) -> None:
        """A plain request whose client hangs up before the reply."""
        try:
            http.post("/v1/completions", json={"prompt": self.rng.choice(PROMPTS), "max_tokens": 200},
                      timeout=httpx.Timeout(600, read=0.05))
        except httpx.ReadTimeout:
            self.tally.add("disconnected")
            return
        self.tally.add("disconnect-answered")   # a reply quicker than the hang-up: nothing to count against

    def bad(self, http: httpx.Client, body: bytes | None = None) -> None:
        body = body or self.rng.choice(BAD_BODIES)
        response = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        if 400 <= response.status_code < 500 and "error" in response.json():
            self.tally.add("bad-body-4xx")
        else:
            label = "5xx" if response.status_code >= 500 else "unexpected-status"
            self.tally.add(label, f"bad body {body[:40]!r}: {response.status_code} {response.text[:300]}")


def record_solo(url: str) -> dict[str, list[str]]:
    """Each greedy case's reply, asked alone."""
    solo = {}
    with httpx.Client(base_url=url, timeout=600) as http:
        for name, path, body in greedy_cases():
            with http.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    response.read()
                    raise RuntimeError(f"the solo run of {name} got {response.status_code}: {response.text[:500]}")
                solo[name] = reply_text(path, response, bool(body.get("stream")))
    return solo


# ---- the samples ------------------------------------------------------------------------------------------

GAUGES = ("mnngpu_slots_busy", "mnngpu_requests_waiting", "mnngpu_kv_cache_tokens")


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024


def gauges(http: httpx.Client) -> dict[str, float]:
    """The GAUGES from GET /metrics, summed over their labels (a model each, with several)."""
    values = dict.fromkeys(GAUGES, 0.0)
    for line in http.get("/metrics").text.splitlines():
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values


class Sampler(threading.Thread):
    def __init__(self, url: str, pid: int, every_s: float, start: float):
        super().__init__(name="soak-sampler", daemon=True)
        self.url, self.pid, self.every_s, self.start_time = url, pid, every_s, start
        self.samples: list[dict] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while not self.stopped.is_set():
                self.samples.append({"t": round(time.monotonic() - self.start_time, 1), "rss_mb": rss_mb(self.pid),
                                     **gauges(http)})
                self.stopped.wait(self.every_s)


def slots_freed(url: str) -> bool:
    deadline = time.monotonic() + FREE_SLOTS_S
    with httpx.Client(base_url=url, timeout=60) as http:
        while time.monotonic() < deadline:
            values = gauges(http)
            if values["mnngpu_slots_busy"] == 0 and values["mnngpu_requests_waiting"] == 0:
                return http.get("/health").status_code == 200
            time.sleep(0.5)
    return False


def summary(args, tally: Tally, samples: list[dict], freed: bool, seconds: float, solo_count: int) -> dict:
    warm = [s for s in samples if s["t"] >= args.warm_up * seconds] or samples
    rss_warm, rss_end = warm[0]["rss_mb"], samples[-1]["rss_mb"]
    bad = {key: tally.counts[key] for key in ("5xx", "mismatch", "unexpected-status", "client-error")}
    completed = sum(count for key, count in tally.counts.items() if key.startswith("ok:"))
    return {
        "cpu": cpu_description(), "load_average": [round(x, 2) for x in os.getloadavg()],
        "model": args.model or "demo", "clients": args.clients,
        "minutes": args.minutes, "seconds": round(seconds, 1), "solo_replies": solo_count,
        "counts": dict(sorted(tally.counts.items())), "greedy_replies_checked": completed, **bad,
        "slots_freed_after": freed,
        "rss_mb": {"after_warm_up": round(rss_warm, 1), "end": round(rss_end, 1),
                   "peak": round(max(s["rss_mb"] for s in samples), 1),
                   "growth_after_warm_up_pct": round(100 * (rss_end - rss_warm) / rss_warm, 2)},
        "slots_busy": {"mean": round(statistics.fmean(s["mnngpu_slots_busy"] for s in samples), 2),
                       "max": max(s["mnngpu_slots_busy"] for s in samples)},
        "kv_cache_tokens_max": max(s["mnngpu_kv_cache_tokens"] for s in samples),
        "failures": tally.failures, "samples": samples,
        "passed": freed and not any(bad.values()),
    }


def print_summary(result: dict) -> None:
    rss = result["rss_mb"]
    lines = [f"soak: {result['clients']} clients, {result['seconds']} s, {result['model']} on {result['cpu']} "
             f"(load average {' '.join(map(str, result['load_average']))} at the end)",
             f"greedy replies checked against their solo replies: {result['greedy_replies_checked']} "
             f"({result['solo_replies']} solo replies recorded)",
             "counts: " + ", ".join(f"{key} {value}" for key, value in result["counts"].items()),
             f"5xx: {result['5xx']}  mismatched: {result['mismatch']}  unexpected status: "
             f"{result['unexpected-status']}  client errors: {result['client-error']}",
             f"RSS: {rss['after_warm_up']} MB after warm-up, {rss['end']} MB at the end "
             f"({rss['growth_after_warm_up_pct']:+.2f}%), peak {rss['peak']} MB",
             f"busy slots: mean {result['slots_busy']['mean']}, max {result['slots_busy']['max']:.0f}; "
             f"KV cache tokens max {result['kv_cache_tokens_max']:.0f}",
             f"slots free again after the clients stopped: {result['slots_freed_after']}",
             *(f"  failure: {failure}" for failure in result["failures"][:20]),
             "PASSED" if result["passed"] else "FAILED"]
    print("\n".join(lines), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="model folder (default: the bundled demo model)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--threads", "-t", type=int, default=2, help="the server's --threads")
    parser.add_argument("--parallel", type=int, help="the server's --parallel (default: its own)")
    parser.add_argument("--backend", help="the server's --backend")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples (default: 5)")
    parser.add_argument("--warm-up", type=float, default=0.2,
                        help="fraction of the run before the RSS growth is measured from (default: 0.2)")
    parser.add_argument("--json", type=Path, help="write the summary (and every sample) here")
    return parser.parse_args(argv)


def server_command(args, port: int) -> list[str]:
    command = [sys.executable, "-m", "mnngpu", "serve", *([args.model] if args.model else []), "--port", str(port),
               "-t", str(args.threads), "--sampler", "greedy", "--quiet", "--max-queue", str(4 * args.clients + 8)]
    command += ["--parallel", str(args.parallel)] if args.parallel else []
    return command + (["--backend", args.backend] if args.backend else [])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    port = free_port()
    with Server("soak", server_command(args, port), port, {}) as server:
        solo = record_solo(server.url)
        tally = Tally()
        start = time.monotonic()
        sampler = Sampler(server.url, server.process.pid, args.sample_s, start)
        sampler.start()
        clients = [Client(number, server.url, solo, start + 60 * args.minutes, tally) for number in range(args.clients)]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        seconds = time.monotonic() - start
        freed = slots_freed(server.url)
        sampler.stopped.set()
        sampler.join()
        alive = server.process.poll() is None
    result = summary(args, tally, sampler.samples, freed and alive, seconds, len(solo))
    print_summary(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
