"""llm_bench for mnngpu: prefill and decode speed per model x backend x precision x threads.

The tests follow MNN's llm_bench (transformers/llm/engine/tools/llm_bench.cpp):
* ppN: prefill N tokens (all id 16) from an empty KV cache; speed = N / prefill time.
* tgM: from a 1-token prompt, decode M tokens; speed = M / decode time.
* ppN+tgM (`-pg N,M`): prefill N tokens, then decode M continuing from that KV cache; both
  speeds are reported, as llm_bench's -pg does: prefill = N / the prompt's forward time,
  decode = M / the time of the M forwards after each sampled token (sampling not included).
Every test runs `repeat + 1` times and drops the first (the warm-up). Decoding samples each token
with the model's configured sampler, as llm_bench does, but ignores stop ids, so every repeat
does the same work. With the loading time asked for, `firstRun(s)` is that dropped first run:
what the first use after the load still costs (kernel compiles, first page faults). On a
fixed-shape backend (opencl, vulkan, cuda) a prefill's last chunk is padded up to the module's
rows; the test cell then says how many rows were padded (they count in the time, not in N). With a speculative strategy (`--speculative`), decoding runs that strategy
through Llm.generate, and the table adds its draft acceptance rate and tokens per forward.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mnngpu import jit
from mnngpu.errors import ConfigError
from mnngpu.model_label import model_label

BENCH_TOKEN = 16
PRECISIONS = {0: "normal", 1: "high", 2: "low"}   # llm_bench's -c numbers
PRECISION_NAMES = {"normal": "Normal", "high": "High", "low": "Low"}


@dataclass(frozen=True)
class RuntimeCase:
    """What one model load is made with."""

    model: Path
    backend: str
    precision: str
    memory: str
    threads: int
    speculative: str = ""   # speculative_type; "" is AR


@dataclass(frozen=True)
class TestCase:
    n_prompt: int
    n_gen: int
    shared_kv: bool = False   # -pg: decode continues from the prefill's KV cache

    @property
    def name(self) -> str:
        if self.n_gen == 0:
            return f"pp{self.n_prompt}"
        if self.n_prompt == 0:
            return f"tg{self.n_gen}"
        return f"pp{self.n_prompt}+tg{self.n_gen}"


@dataclass
class BenchResult:
    runtime: RuntimeCase
    test: TestCase
    model_name: str
    model_bytes: int
    prefill_speeds: list[float] = field(default_factory=list)   # tok/s, one per repeat
    decode_speeds: list[float] = field(default_factory=list)
    load_seconds: list[float] = field(default_factory=list)
    first_run_seconds: float = 0.0   # the dropped warm-up repeat
    padded_rows: int = 0             # rows computed beyond n_prompt (fixed-shape prefill)
    acceptance: list[float] = field(default_factory=list)   # speculative decoding only
    tokens_per_forward: list[float] = field(default_factory=list)

    @property
    def speeds(self) -> list[float]:
        """The single speed of a pp or tg row."""
        return self.decode_speeds if self.test.n_prompt == 0 else self.prefill_speeds


def parse_precision(value: str) -> str:
    """A precision name, or llm_bench's number (0 normal, 1 high, 2 low)."""
    text = value.strip().lower()
    if text.isdigit() and int(text) in PRECISIONS:
        return PRECISIONS[int(text)]
    if text in PRECISION_NAMES:
        return text
    raise ConfigError(f"precision low|normal|high or 0|1|2 (llm_bench's numbers), got '{value}'", field="-c")


def parse_pairs(values: Iterable[str]) -> list[tuple[int, int]]:
    pairs = []
    for value in values:
        parts = value.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise ConfigError(f"-pg takes PROMPT,GEN (two integers), got '{value}'", field="-pg")
        pairs.append((int(parts[0]), int(parts[1])))
    return pairs


def test_cases(n_prompt: list[int], n_gen: list[int], pairs: list[tuple[int, int]]) -> list[TestCase]:
    """llm_bench's order: the pp tests, the tg tests, then the -pg pairs; zeros are skipped."""
    cases = [TestCase(p, 0) for p in n_prompt if p > 0]
    cases += [TestCase(0, n) for n in n_gen if n > 0]
    cases += [TestCase(p, n, shared_kv=True) for p, n in pairs if p > 0 or n > 0]
    return cases


def runtime_cases(models: list[Path], backends: list[str], precisions: list[str], memory: str,
                  threads: list[int], speculative: str = "") -> list[RuntimeCase]:
    """One per model load, in llm_bench's nesting (model, backend, precision, threads)."""
    return [RuntimeCase(m, b, p, memory, t, speculative) for m in models for b in backends for p in precisions
            for t in sorted(threads, reverse=True)]


def load_model(case: RuntimeCase):
    """The model of one case, each setting blamed on the flag of `mnngpu bench` that gave it."""
    from mnngpu import llm as mnngpu_llm
    from mnngpu.config import CommandLine

    model = mnngpu_llm.create(case.model)
    for flag, values in (("--backends", {"backend_type": case.backend}), ("--precision", {"precision": case.precision}),
                         ("--memory", {"memory": case.memory}), ("--threads", {"thread_num": case.threads}),
                         ("--speculative", {"speculative_type": case.speculative}),
                         ("mnngpu bench", {"reuse_kv": False})):
        model.config.set_config(values, source=CommandLine(flag))
    model.load()
    return model


def _decode(model, first_logits, count: int) -> float:
    """Seconds of the forwards of `count` tokens sampled one by one after `first_logits`."""
    history: list[int] = []
    logits = first_logits
    seconds = 0.0
    for _ in range(count):
        token = int(model.sampler.sample(logits, history))
        history.append(token)
        start = time.perf_counter()
        logits = model.forward([token])[0, -1]
        seconds += time.perf_counter() - start
    return seconds


def _prefill(model, count: int):
    start = time.perf_counter()
    logits = model.forward([BENCH_TOKEN] * count)[0, -1]
    return logits, time.perf_counter() - start


def _speculative_run(model, test: TestCase, result: BenchResult, keep: bool) -> None:
    """One repeat through the strategy: the prompt, then n_gen tokens past any stop id."""
    model.reset()
    model.generate([BENCH_TOKEN] * max(1, test.n_prompt), test.n_gen, stop_ids=())
    if not keep or not model.context.decode_us:
        return
    context, stats = model.context, model.strategy.stats
    if test.n_prompt:
        result.prefill_speeds.append(test.n_prompt / (context.prefill_us / 1e6))
    result.decode_speeds.append(context.gen_seq_len / (context.decode_us / 1e6))
    result.acceptance.append(stats.acceptance_rate)
    result.tokens_per_forward.append(stats.tokens_per_forward)


def _ar_run(model, test: TestCase, result: BenchResult, keep: bool) -> None:
    """One repeat: a prefill of n_prompt ids (one for a tg test), then n_gen decoded tokens."""
    model.reset()
    logits, prefill_s = _prefill(model, max(1, test.n_prompt))
    decode_s = _decode(model, logits, test.n_gen) if test.n_gen else 0.0
    if not keep:
        return
    if test.n_prompt:
        result.prefill_speeds.append(test.n_prompt / prefill_s)
    if test.n_gen:
        result.decode_speeds.append(test.n_gen / decode_s)


def run_test(model, test: TestCase, repeat: int, result: BenchResult) -> None:
    result.padded_rows = model.padded_rows(test.n_prompt)
    one_run = _speculative_run if result.runtime.speculative and test.n_gen else _ar_run
    for index in range(repeat + 1):
        start = time.perf_counter()
        one_run(model, test, result, keep=index > 0)
        if index == 0:   # the warm-up: kernel compiles, first touch of the weights
            jit.wait_for_compiles()   # time the compiled kernels, never their numpy stand-ins
            result.first_run_seconds = time.perf_counter() - start


def run(runtimes: list[RuntimeCase], tests: list[TestCase], repeat: int, loading_time: bool = False,
        on_result: Callable[[BenchResult], None] | None = None) -> list[BenchResult]:
    results = []
    for runtime in runtimes:
        loads = []
        for _ in range(3 if loading_time else 1):
            start = time.perf_counter()
            model = load_model(runtime)
            loads.append(time.perf_counter() - start)
        name = model_label(model.config.base_dir)
        size = Path(model.config.weight_path).stat().st_size
        for test in tests:
            result = BenchResult(runtime, test, name, size, load_seconds=loads if loading_time else [])
            run_test(model, test, repeat, result)
            results.append(result)
            if on_result is not None:
                on_result(result)
        del model
    return results


# ---- llm_bench's markdown table ---------------------------------------------------------------

def _mean_std(values: list[float]) -> str:
    mean = statistics.fmean(values) if values else 0.0
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {std:.2f}"


def _test_cell(result: BenchResult) -> str:
    padded = result.padded_rows
    return f"{result.test.name} (+{padded} padded)" if padded else result.test.name


def _size(nbytes: int) -> str:
    if nbytes < 1 << 30:
        return f"{nbytes / (1 << 20):.2f} MiB"
    return f"{nbytes / (1 << 30):.2f} GiB"


class MarkdownTable:
    """The header, separator and rows of llm_bench's table, each column as wide as its header and
    its usual values, so rows printed one by one line up (llm_bench's own widths do not)."""

    def __init__(self, tests: list[TestCase], loading_time: bool = False, speculative: bool = False):
        speed = "speed(tok/s)" if any(t.shared_kv for t in tests) else "t/s"
        self.fields = ["model", "modelSize", "backend", "threads", "precision", "test", speed]
        if loading_time:
            self.fields += ["loadingTime(s)", "firstRun(s)"]
        if speculative:
            self.fields += ["acceptance", "tok/forward"]

    @staticmethod
    def width(name: str) -> int:
        """Negative: left-aligned (llm_bench's strings), positive: right-aligned (its numbers)."""
        fixed = {"model": -30, "threads": 7, "test": -24,
                 "t/s": 18, "speed(tok/s)": 38}  # room for "12345.67 ± 1234.56", twice for pp+tg
        if name in fixed:
            return fixed[name]
        width = max(len(name), 10)
        return width if name == "modelSize" else -width

    def _line(self, values: list[str]) -> str:
        cells = []
        for name, value in zip(self.fields, values):
            width = self.width(name)
            cells.append(value.rjust(width) if width > 0 else value.ljust(-width))
        return "| " + " | ".join(cells) + " |"

    def header(self) -> str:
        separator = "| " + " | ".join("-" * (abs(self.width(n)) - 1) + (":" if self.width(n) > 0 else "-")
                                      for n in self.fields) + " |"
        return self._line(self.fields) + "\n" + separator

    def row(self, result: BenchResult) -> str:
        test = result.test
        if test.shared_kv:
            speed = f"{_mean_std(result.prefill_speeds)}<br>{_mean_std(result.decode_speeds)}"
        else:
            speed = _mean_std(result.speeds)
        values = [result.model_name, _size(result.model_bytes), result.runtime.backend.upper(),
                  str(result.runtime.threads), PRECISION_NAMES[result.runtime.precision], _test_cell(result), speed]
        if "loadingTime(s)" in self.fields:
            values += [_mean_std(result.load_seconds), f"{result.first_run_seconds:.2f}"]
        if "acceptance" in self.fields:
            values += [f"{100 * statistics.fmean(result.acceptance):.1f} %" if result.acceptance else "-",
                       f"{statistics.fmean(result.tokens_per_forward):.2f}" if result.tokens_per_forward else "-"]
        return self._line(values)
