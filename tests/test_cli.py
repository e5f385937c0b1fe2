"""`mnngpu run` and the pieces every model command shares: flags, the load progress, the summary.

Truths: MNN's recorded greedy replies for the fixture and the HF tokenizer of its source.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mnngpu.cli import build_parser, main
from mnngpu.progress import LoadProgress, format_bar
from tests.conftest import reference
from tests.reference_model import (
    CHAT_PROMPT,
    CHAT_QUESTION,
    CLI_ORACLE_FLAGS,
    MODEL_DIR,
    RAW_PROMPT,
    greedy_reply,
    hf_count,
    load_model,
)


def stat(stderr: str, name: str) -> float:
    return float(re.search(rf"^{name} = ([0-9.]+)", stderr, re.MULTILINE).group(1))


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["run", str(MODEL_DIR), *CLI_ORACLE_FLAGS, "--sampler", "greedy", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_run_streams_mnns_greedy_reply_then_llm_demo_stats(capsys):
    code, out, err = run_cli(capsys, "-p", RAW_PROMPT, "--no-template", "-n", "8")
    ids, text = greedy_reply(RAW_PROMPT, 8)
    assert code == 0 and out == text + "\n"
    assert stat(err, "prompt tokens num") == hf_count(RAW_PROMPT)
    assert stat(err, "decode tokens num") == len(ids)
    assert stat(err, "prefill speed") > 0 and stat(err, "decode speed") > 0
    assert re.search(r"^ready: qwen2_int4_b64 \(qwen2, 2 layers, hidden 128, .* on cpu in [0-9.]+ s$", err, re.MULTILINE)


def test_run_applies_the_chat_template_by_default(capsys):
    code, out, err = run_cli(capsys, "-p", CHAT_QUESTION, "-n", "8")
    assert code == 0 and out == greedy_reply(CHAT_PROMPT, 8)[1] + "\n"
    assert stat(err, "prompt tokens num") == hf_count(CHAT_PROMPT)


def test_run_with_lookahead_streams_the_same_greedy_reply(capsys):
    prompt = reference(MODEL_DIR.name)[0]["prompts"][-1]["text"]   # a long text with repeats
    code, out, err = run_cli(capsys, "-p", prompt, "--no-template", "-n", "16", "--speculative", "lookahead")
    assert code == 0 and out == greedy_reply(prompt, 16)[1] + "\n"
    assert re.search(r"^lookahead: [0-9.]+ % of drafts accepted, [0-9.]+ tokens per decode forward$", err, re.MULTILINE)


def test_run_reads_config_overrides(capsys):
    code, _, err = run_cli(capsys, "-p", RAW_PROMPT, "--no-template", "--config", "max_new_tokens=3")
    assert code == 0 and stat(err, "decode tokens num") == len(greedy_reply(RAW_PROMPT, 3)[0])


@pytest.mark.parametrize(("args", "message"), [
    (["--config", "no_equals_sign"], "expected KEY=VALUE"),
    (["--backend", "abacus"], "abacus"),
    (["--config", "temperature=-1", "--sampler", "temperature"], "temperature"),
    (["--speculative", "mtp"], "'mtp' needs mtp.mnn (mtp_model) in the model folder"),
    (["--speculative", "eagle"], "'eagle' needs eagle.mnn (eagle_model) in the model folder"),
])
def test_run_reports_a_bad_setting_in_one_line(capsys, args, message):
    code = main(["run", str(MODEL_DIR), "-p", "x", "-n", "1", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err
    assert [line for line in err.splitlines() if line.startswith("error: ")] == err.strip().splitlines()[-1:]


def test_without_a_model_folder_run_uses_the_bundled_demo_model(capsys):
    from mnngpu.demo import DEMO_MODEL_DIR

    code = main(["run", "-p", "Once upon a time", "-n", "4"])
    err = capsys.readouterr().err
    if (DEMO_MODEL_DIR / "config.json").is_file():
        assert code == 0 and "ready: " + DEMO_MODEL_DIR.name in err
    else:
        assert code == 2 and str(DEMO_MODEL_DIR / "config.json") in err


def test_the_console_script_runs_from_a_fresh_process():
    done = subprocess.run([sys.executable, "-m", "mnngpu", "run", str(MODEL_DIR), *CLI_ORACLE_FLAGS, "--sampler",
                           "greedy", "-p", RAW_PROMPT, "--no-template", "-n", "8"],
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (greedy_reply(RAW_PROMPT, 8)[1] + "\n").encode("utf-8")
    assert b"\r" not in done.stderr  # stderr is a pipe: no progress bar, only the summary


def test_serve_binds_loopback_unless_told_otherwise():
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port) == ("127.0.0.1", 8000)


def test_load_reports_each_stage_from_start_to_end():
    seen: list[tuple[str, int, int]] = []
    load_model()  # warm the numba caches so this one stays quick
    from mnngpu import llm

    model = llm.create(MODEL_DIR / "config.json")
    model.load(progress=lambda stage, done, total: seen.append((stage, done, total)))
    stages = list(dict.fromkeys(stage for stage, _, _ in seen))
    assert stages == ["weights mapped", "weights packed"]
    for stage in stages:
        steps = [(done, total) for name, done, total in seen if name == stage]
        assert steps[0][0] == 0 and steps[-1][0] == steps[-1][1] >= 1
        assert all(0 <= done <= total for done, total in steps)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_draws_on_a_terminal_and_clears_itself():
    screen = FakeTerminal()
    bar = LoadProgress(screen)
    bar("weights packed", 1, 4)
    bar("weights packed", 4, 4)
    bar.close()
    drawn = screen.getvalue().split("\r")
    assert drawn[1] == format_bar("weights packed", 1, 4)
    assert drawn[2] == format_bar("weights packed", 4, 4)
    assert drawn[3].strip() == "" and screen.getvalue().endswith("\r")
    assert format_bar("weights packed", 1, 4).count("#") * 4 == format_bar("weights packed", 4, 4).count("#")


def test_the_progress_bar_writes_nothing_off_a_terminal():
    log = io.StringIO()
    bar = LoadProgress(log)
    bar("weights packed", 1, 2)
    bar.close()
    assert log.getvalue() == ""


def test_every_package_the_cli_imports_is_in_the_wheel():
    """pyproject lists packages by hand (backends/ and shaders/ are mapped), so a new folder is
    easy to forget; an editable install would not notice, a wheel would lose it."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(("mnngpu", *init.parent.relative_to(root / "mnngpu").parts))
             for init in (root / "mnngpu").rglob("__init__.py")}
    assert found <= listed
