"""`mnngpu bench` follows MNN's llm_bench (transformers/llm/engine/tools/llm_bench.cpp): its flags, its
test semantics (pp / tg / pp+tg, one warm-up dropped) and its markdown table; and
benchmarks/compare_mnn.py runs both engines and reports them side by side."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mnngpu.apps import bench, cli
from mnngpu.errors import ConfigError
from tests.conftest import FIXTURES

MODEL = FIXTURES / "qwen2_int4_b64"
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("value, name", [("0", "normal"), ("1", "high"), ("2", "low"), ("Low", "low"),
                                         ("high", "high")])
def test_precision_takes_llm_bench_numbers_and_names(value, name):
    assert bench.parse_precision(value) == name


@pytest.mark.parametrize("value", ["3", "fp16", "-1"])
def test_bad_precision_is_a_config_error(value):
    with pytest.raises(ConfigError, match="-c"):
        bench.parse_precision(value)


def test_bad_pg_is_a_config_error():
    with pytest.raises(ConfigError, match="PROMPT,GEN"):
        bench.parse_pairs(["512"])


def test_tests_come_in_llm_bench_order_and_zeros_are_skipped():
    cases = bench.test_cases([512, 0], [128], bench.parse_pairs(["512,128"]))
    assert [c.name for c in cases] == ["pp512", "tg128", "pp512+tg128"]
    assert [c.shared_kv for c in cases] == [False, False, True]
    assert bench.test_cases([0], [0], []) == []


def test_threads_run_largest_first_like_llm_bench():
    cases = bench.runtime_cases([Path("m")], ["cpu"], ["low"], "low", [1, 4, 2])
    assert [c.threads for c in cases] == [4, 2, 1]


class CountingModel:
    """Stands in for an Llm: records every reset and forward, returns fixed logits."""

    def __init__(self):
        self.calls: list[object] = []
        self.sampler = self

    def reset(self):
        self.calls.append("reset")

    def forward(self, ids):
        self.calls.append(len(ids))
        return np.zeros((1, 1, 8), dtype=np.float32)

    def sample(self, logits, history):
        return 3

    def padded_rows(self, count):
        return 0


@pytest.mark.parametrize("test, per_repeat", [
    (bench.TestCase(6, 0), ["reset", 6]),                       # pp: prefill only
    (bench.TestCase(0, 3), ["reset", 1, 1, 1, 1]),              # tg: a 1-token prompt, then 3 decodes
    (bench.TestCase(5, 2, shared_kv=True), ["reset", 5, 1, 1]),  # pp+tg: decode from the prefill's cache
])
def test_each_repeat_does_llm_bench_work_and_the_warm_up_is_dropped(test, per_repeat):
    model = CountingModel()
    result = bench.BenchResult(bench.RuntimeCase(MODEL, "cpu", "low", "low", 1), test, "m", 1)
    bench.run_test(model, test, repeat=2, result=result)
    assert model.calls == per_repeat * 3
    assert len(result.prefill_speeds) == (2 if test.n_prompt else 0)
    assert len(result.decode_speeds) == (2 if test.n_gen else 0)


class Clock:
    """A stand-in for time.perf_counter that only moves when the model works: a forward takes 0.5,
    a sample 2.0 "seconds"."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_pg_speeds_are_llm_bench_s_forward_times_without_sampling(monkeypatch):
    clock, model = Clock(), CountingModel()
    real_forward, real_sample = model.forward, model.sample

    def forward(ids):
        clock.now += 0.5
        return real_forward(ids)

    def sample(logits, history):
        clock.now += 2.0
        return real_sample(logits, history)

    model.forward, model.sample = forward, sample
    monkeypatch.setattr(bench.time, "perf_counter", clock)
    test = bench.TestCase(4, 3, shared_kv=True)
    result = bench.BenchResult(bench.RuntimeCase(MODEL, "cpu", "low", "low", 1), test, "m", 1)
    bench.run_test(model, test, repeat=1, result=result)
    assert result.prefill_speeds == [4 / 0.5]            # the prompt's one forward
    assert result.decode_speeds == [3 / (3 * 0.5)]       # three forwards; the samples are not timed
    assert result.first_run_seconds == 0.5 + 3 * (2.0 + 0.5)   # the dropped warm-up, all of it


def test_first_run_and_padded_rows_are_shown(backend_type):
    model = bench.load_model(bench.RuntimeCase(MODEL, backend_type, "high", "low", 1))
    rows = model.pool.width(7)   # rows of the prefill module that takes the 7 prefilled ids
    want = (rows - 7) if model.runtime.fixed_shape else 0  # 8 ids: 7 prefilled, the last decoded
    assert model.padded_rows(8) == want
    result = bench.BenchResult(bench.RuntimeCase(MODEL, backend_type, "high", "low", 1), bench.TestCase(8, 0),
                               "m", 1, load_seconds=[0.1])
    bench.run_test(model, result.test, repeat=1, result=result)
    table = bench.MarkdownTable([result.test], loading_time=True)
    cells = [cell.strip() for cell in table.row(result).split("|")[1:-1]]
    assert table.fields[-2:] == ["loadingTime(s)", "firstRun(s)"]
    assert result.first_run_seconds > 0 and cells[-1] == f"{result.first_run_seconds:.2f}"   # a tiny model's may print 0.00
    assert cells[5] == (f"pp8 (+{want} padded)" if want else "pp8")


def bar_positions(line: str) -> list[int]:
    return [i for i, char in enumerate(line) if char == "|"]


def test_table_has_llm_bench_columns_and_they_line_up():
    table = bench.MarkdownTable(bench.test_cases([512], [128], []))
    header, separator = table.header().splitlines()
    assert [cell.strip() for cell in header.split("|")[1:-1]] == [
        "model", "modelSize", "backend", "threads", "precision", "test", "t/s"]
    assert separator.split("|")[2].strip().endswith(":") and separator.split("|")[3].strip().endswith("-")
    runtime = bench.RuntimeCase(MODEL, "cpu", "low", "low", 2)
    result = bench.BenchResult(runtime, bench.TestCase(512, 0), "qwen", 309191306,
                               prefill_speeds=[9000.0, 10000.0, 11000.0])
    row = table.row(result)
    assert [cell.strip() for cell in row.split("|")[1:-1]] == [
        "qwen", "294.87 MiB", "CPU", "2", "Low", "pp512", "10000.00 ± 1000.00"]
    assert bar_positions(header) == bar_positions(separator) == bar_positions(row)


def test_pg_rows_report_prefill_and_decode():
    table = bench.MarkdownTable(bench.test_cases([], [], [(512, 128)]))
    assert "speed(tok/s)" in table.header()
    runtime = bench.RuntimeCase(MODEL, "cpu", "high", "low", 2)
    result = bench.BenchResult(runtime, bench.TestCase(512, 128, True), "qwen", 2 << 30,
                               prefill_speeds=[60.0, 62.0], decode_speeds=[25.0, 25.0])
    assert table.row(result).split("|")[-3:-1] == [" " + "pp512+tg128".ljust(25), " 61.00 ± 1.41<br>25.00 ± 0.00 ".rjust(40)]
    assert "2.00 GiB" in table.row(result)
    assert bar_positions(table.row(result)) == bar_positions(table.header().splitlines()[0])


def test_bench_command_prints_one_row_per_test():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["bench", "-m", str(MODEL), "-t", "1", "-c", "low", "-p", "8", "-n", "3", "-pg", "4,2",
                         "-rep", "2"])
    assert code == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("| model ") and lines[2].startswith("| qwen2_int4_b64")  # the header, then rows
    rows = [line for line in lines if line.startswith("| qwen2_int4_b64")]
    assert [row.split("|")[6].strip() for row in rows] == ["pp8", "tg3", "pp4+tg2"]
    speeds = [row.split("|")[7] for row in rows]
    assert "<br>" in speeds[2]
    for cell in speeds:
        for part in cell.split("<br>"):
            mean, std = (float(v) for v in part.split("±"))
            assert mean > 0 and std >= 0


def test_bench_threads_default_to_the_cores_this_process_may_use():
    import os

    assert cli.build_parser().parse_args(["bench"]).threads == [len(os.sched_getaffinity(0))]


def test_compare_mnn_reports_both_engines():
    pytest.importorskip("MNN.llm")
    done = subprocess.run([sys.executable, "-m", "benchmarks.compare_mnn", str(MODEL), "--threads", "1",
                           "--prompt", "8", "--decode", "2", "--rounds", "1", "--no-bandwidth"],
                          check=False, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert sum(line.startswith("round 1") for line in lines) == 2
    for metric in ("decode tok/s", "prefill tok/s", "load s", "peak RSS (MB)"):
        row = next(line for line in lines if line.startswith(f"| {metric} "))
        assert row.rstrip().endswith("x |")
    assert any(line.startswith("mnngpu decode streams") for line in lines)
    cpu_line = next(line for line in lines if line.startswith("CPU: "))   # figures name their machine
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), None) if Path("/proc/cpuinfo").exists() else None
    assert model is None or model in cpu_line


def test_speculative_rows_report_acceptance_and_tokens_per_forward():
    case = bench.RuntimeCase(MODEL, "cpu", "high", "low", 1, speculative="lookahead")
    (result,) = bench.run([case], [bench.TestCase(12, 24, shared_kv=True)], repeat=1)
    assert len(result.decode_speeds) == len(result.acceptance) == len(result.tokens_per_forward) == 1
    assert 0.0 <= result.acceptance[0] <= 1.0 and result.tokens_per_forward[0] >= 1.0
    table = bench.MarkdownTable([result.test], speculative=True)
    assert table.header().splitlines()[0].split("|")[-3:-1] == [" acceptance ", " tok/forward "]
    assert table.row(result).count("|") == table.header().splitlines()[0].count("|")
