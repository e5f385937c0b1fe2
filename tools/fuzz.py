"""The long fuzz run: mutated real fixture files against every reader, for as many cases as asked.

    python -m tools.fuzz --cases 10000                 # all reader targets, two worker processes
    python -m tools.fuzz --cases 2000 --targets flow   # the whole folder flow (slower per case)
    python -m tools.fuzz --replay graph:1234           # rerun one case here, with its traceback

Case i goes to target i mod (number of targets) and draws its source file and mutations from a
random stream seeded by (seed, i), so every case can be replayed exactly. The cases run in
worker processes, in chunks: each worker runs a case in-process under a per-case time limit
(SIGALRM) and a memory limit, and reports it before and after; the parent watches the workers,
so a segfault or a hang that the alarm cannot break is still pinned to its case. Every finding
(an exception other than MnnGpuError, a timeout, a crash) is saved under --out as the mutated
file plus a JSON note, and the exit status is 1 when there was any.

The targets themselves are in tools/fuzz_targets.py, shared with the short suite that CI runs.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tools import fuzz_targets as fuzz

REPO = Path(__file__).resolve().parent.parent

CHUNK = 1000  # cases per worker process
MEMORY_GB = 8  # per worker: a reader that tries to allocate more is a finding (MemoryError)
STUCK = "stuck"  # what a worker "said" when it was killed for making no progress


@dataclass(frozen=True)
class Case:
    number: int
    target: fuzz.Target
    source: Path
    mutations: list

    @property
    def label(self) -> str:
        return f"{self.target.name}:{self.number}"


def plan(number: int, names: list[str], seed: int) -> Case:
    """Case `number`: its target, source file and mutations, the same on every machine."""
    target = fuzz.targets()[names[number % len(names)]]
    rng = random.Random(f"{seed}:{number}")
    source = rng.choice(target.sources)
    return Case(number, target, source, fuzz.random_mutations(rng, target.kinds))


# ---- the worker: runs a range of cases, one line per event on stdout ------------------------

def work(names: list[str], seed: int, first: int, count: int, case_seconds: int, scratch: Path) -> None:
    import faulthandler
    import resource
    import warnings

    warnings.simplefilter("ignore")
    faulthandler.enable()  # a segfault prints the Python stack to stderr (the worker's log)
    limit = MEMORY_GB << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for number in range(first, first + count):
        case = plan(number, names, seed)
        _emit({"event": "start", "case": number})
        try:
            with fuzz.time_limit(case_seconds):
                outcome = fuzz.run_case(case.target, case.source, case.mutations, scratch)
            _emit({"event": "done", "case": number, "outcome": outcome})
        except BaseException as error:  # noqa: BLE001  (every other exception is what we look for)
            _emit({"event": "fail", "case": number, "kind": type(error).__name__, "message": str(error)[:500],
                   "traceback": traceback.format_exc()[-4000:]})


def _emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


# ---- the parent: hands out chunks, watches workers, records findings -----------------------

@dataclass
class Results:
    outcomes: dict[str, Counter] = field(default_factory=dict)  # target -> Counter(outcome)
    findings: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, target: str, outcome: str) -> None:
        with self.lock:
            self.outcomes.setdefault(target, Counter())[outcome] += 1

    def total(self) -> int:
        return sum(sum(c.values()) for c in self.outcomes.values())


@dataclass
class Run:
    names: list[str]
    seed: int
    case_seconds: int
    out: Path
    results: Results = field(default_factory=Results)

    def record_finding(self, number: int, kind: str, message: str, details: str = "") -> None:
        case = plan(number, self.names, self.seed)
        self.results.count(case.target.name, "FINDING")
        stem = self.out / f"{case.target.name}-case{number}"
        self.out.mkdir(parents=True, exist_ok=True)
        data = fuzz.mutate(fuzz.source_bytes(case.source), case.mutations)
        stem.with_suffix(".bin").write_bytes(data)
        note = {"case": case.label, "seed": self.seed, "source": str(case.source.relative_to(REPO)),
                "mutations": case.mutations, "kind": kind, "message": message, "details": details,
                "replay": f"python -m tools.fuzz --seed {self.seed} --targets {','.join(self.names)} "
                          f"--replay {case.label}"}
        stem.with_suffix(".json").write_text(json.dumps(note, indent=1))
        with self.results.lock:
            self.results.findings.append(note)
        print(f"FINDING {case.label}: {kind}: {message[:200]}", flush=True)

    @property
    def patience(self) -> int:
        """Seconds without a word from a worker before it counts as stuck (the alarm did not fire)."""
        return 2 * self.case_seconds + 5

    def run_chunk(self, first: int, count: int, worker_id: int) -> int | None:
        """Run cases [first, first+count) in one worker; returns the case to resume from if it died early."""
        end = first + count
        log = self.out / f"worker-{worker_id}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "tools.fuzz", "--worker", "--seed", str(self.seed),
                   "--targets", ",".join(self.names), "--first", str(first), "--count", str(count),
                   "--case-seconds", str(self.case_seconds), "--scratch", str(self.out / f"scratch-{worker_id}")]
        with open(log, "ab") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, cwd=REPO)
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()
            started, finished = None, first  # the case running now; the first case not yet accounted for
            while (line := self._next_line(lines, process, started, log)) not in (None, STUCK):
                record = json.loads(line)
                number = record["case"]
                if record["event"] == "start":
                    started = number
                    continue
                if record["event"] == "done":
                    self.results.count(self.names[number % len(self.names)], record["outcome"])
                else:
                    self.record_finding(number, record["kind"], record["message"], record["traceback"])
                started, finished = None, number + 1
            code = process.wait()
        if started is not None:  # stuck (recorded), or died inside a case: a segfault, an abort, an OOM kill
            if line is not STUCK:
                self.record_finding(started, "crash", f"the worker died with exit status {code}",
                                    log.read_text(errors="replace")[-4000:])
            finished = started + 1
        elif finished < end:
            raise RuntimeError(f"a worker exited with status {code} outside any case; see {log}")
        return finished if finished < end else None

    def _next_line(self, lines: queue.Queue, process: subprocess.Popen, started: int | None, log: Path) -> str | None:
        """The worker's next line; None at its end, STUCK once it is killed for being stuck in a case."""
        try:
            return lines.get(timeout=self.patience)
        except queue.Empty:  # the alarm did not fire: stuck outside Python code
            process.kill()
            if started is None:
                raise RuntimeError(f"a worker made no progress for {self.patience} s outside any case; see {log}")
            self.record_finding(started, "hang", f"no progress for {self.patience} s")
            return STUCK


def _pump(stream, lines: queue.Queue) -> None:
    for raw in stream:
        lines.put(raw.decode())
    lines.put(None)


def run_all(run: Run, cases: int, workers: int) -> None:
    chunks: queue.Queue = queue.Queue()
    for first in range(0, cases, CHUNK):
        chunks.put((first, min(CHUNK, cases - first)))
    busy = [0]  # chunks being run: one of them may hand back its rest after a crash
    lock = threading.Lock()

    def serve(worker_id: int) -> None:
        while True:
            try:
                first, count = chunks.get(timeout=1)
            except queue.Empty:
                with lock:
                    if busy[0] == 0:
                        return
                continue
            with lock:
                busy[0] += 1
            resume = run.run_chunk(first, count, worker_id)
            if resume is not None:
                chunks.put((resume, first + count - resume))
            with lock:
                busy[0] -= 1

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def report(run: Run, seconds: float) -> str:
    lines = [f"{run.results.total()} cases in {seconds:.0f} s (seed {run.seed}), {len(run.results.findings)} findings"]
    for name in run.names:
        outcomes = run.results.outcomes.get(name, Counter())
        shown = ", ".join(f"{key} {value}" for key, value in sorted(outcomes.items()))
        lines.append(f"  {name:<10} {sum(outcomes.values()):>7} cases: {shown}")
    return "\n".join(lines)


def replay(label: str, names: list[str], seed: int) -> int:
    name, _, number = label.partition(":")
    case = plan(int(number), names, seed)
    if case.target.name != name:
        raise SystemExit(f"case {number} belongs to {case.target.name} with --targets {','.join(names)}")
    print(f"{case.label}: {case.source.relative_to(REPO)} with {case.mutations}")
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"mnngpu-fuzz-replay-{os.getpid()}"
    print(fuzz.run_case(case.target, case.source, case.mutations, scratch))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10000)
    parser.add_argument("--targets", default=",".join(fuzz.DEFAULT_TARGETS),
                        help=f"comma-separated, from {sorted(fuzz.targets())}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--case-seconds", type=int, default=30, help="per-case time limit")
    parser.add_argument("--out", type=Path, default=Path("fuzz-findings"), help="findings and worker logs")
    parser.add_argument("--replay", metavar="TARGET:CASE")
    for hidden in ("--first", "--count"):
        parser.add_argument(hidden, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = args.targets.split(",")
    unknown = sorted(set(names) - set(fuzz.targets()))
    if unknown:
        parser.error(f"unknown targets {unknown}")
    if args.worker:
        work(names, args.seed, args.first, args.count, args.case_seconds, args.scratch)
        return 0
    if args.replay:
        return replay(args.replay, names, args.seed)
    run = Run(names, args.seed, args.case_seconds, args.out.resolve())
    start = time.perf_counter()
    run_all(run, args.cases, args.workers)
    print(report(run, time.perf_counter() - start))
    return 1 if run.results.findings else 0


if __name__ == "__main__":
    sys.exit(main())
