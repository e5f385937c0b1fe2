"""The command line on bad input: one `error: ...` line on stderr, exit 2, no traceback, the folder unchanged."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mnngpu.apps import cli
from tests.robustness.damages import every_model_damages
from tests.robustness.folders import TEXT, assert_one_error_line, model_copy, run_cli, untouched

MODEL = "qwen2_int4_b64"
# damage name -> whether `mnngpu inspect` reads the damaged part too (it reads neither tokenizer nor embedding)
CLI_DAMAGES = {
    "weights cut in half": True, "graph random bytes": True, "config.json not JSON": True,
    "hidden_size a string": True, "backend_type unknown": False, "hidden_size disagrees with the weights": False,
    "tokenizer cut in half": False, "embedding missing": False, "tokenizer vocab larger than the model's": False,
}
DAMAGES = {damage.name: damage for damage in every_model_damages(MODEL)}


@pytest.mark.parametrize("name", sorted(CLI_DAMAGES))
def test_run_and_inspect_print_one_error_line(tmp_path, name):
    damage = DAMAGES[name]
    folder = model_copy(tmp_path, MODEL)
    damage.apply(folder)
    with untouched(folder):
        lines = [assert_one_error_line(run_cli("run", str(folder), "-p", TEXT, "-n", "2"))]
        if CLI_DAMAGES[name]:
            lines.append(assert_one_error_line(run_cli("inspect", str(folder))))
    for line in lines:
        assert damage.names is None or f"{folder / damage.names}:" in line, line


def test_a_missing_model_folder(tmp_path):
    missing = tmp_path / "no_such_model"
    for command in ("run", "inspect"):
        line = assert_one_error_line(run_cli(command, str(missing)))
        assert str(missing) in line


def test_usage_mistakes_are_one_line_too():
    line = assert_one_error_line(run_cli("run", "--threads", "four"))
    assert "--threads" in line and "four" in line
    assert "command" in assert_one_error_line(run_cli())
    assert "bogus" in assert_one_error_line(run_cli("bogus"))


def test_os_errors_are_reported_as_the_file_they_concern(tmp_path):
    # Files that cannot be opened (a folder where a file should be, a symlink loop) are OSErrors
    # inside the readers; each must come out as the one line naming that file.
    folder = model_copy(tmp_path, MODEL)
    (folder / "llm.mnn").unlink()
    (folder / "llm.mnn").mkdir()
    assert str(folder / "llm.mnn") in assert_one_error_line(run_cli("inspect", str(folder)))
    folder = model_copy(tmp_path / "loop", MODEL)
    (folder / "llm.mnn.weight").unlink()
    os.symlink("llm.mnn.weight", folder / "llm.mnn.weight")
    assert str(folder / "llm.mnn.weight") in assert_one_error_line(run_cli("run", str(folder), "-n", "1"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_files(tmp_path):
    for name in ("config.json", "llm.mnn", "llm.mnn.weight", "embeddings_bf16.bin", "tokenizer.mtok"):
        folder = model_copy(tmp_path / name, MODEL)
        (folder / name).chmod(0)
        assert name in assert_one_error_line(run_cli("run", str(folder), "-n", "1"))


def test_debug_shows_the_traceback(tmp_path):
    result = run_cli("--debug", "inspect", str(tmp_path / "missing"))
    assert result.returncode != 0 and "Traceback" in result.stderr and "ConfigError" in result.stderr


def test_warnings_print_as_one_line(tmp_path):
    folder = model_copy(tmp_path, MODEL)
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    result = subprocess.run([sys.executable, "-m", "mnngpu", "run", str(folder), "-n", "1", "--config", "colour=1"],
                            capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "colour" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: "), result.stderr


def test_a_closed_stdout_ends_quietly(tmp_path):
    folder = model_copy(tmp_path, MODEL)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}  # stdout block-buffered
    process = subprocess.Popen([sys.executable, "-m", "mnngpu", "inspect", str(folder)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    process.stdout.close()  # before the child has started writing: its first write finds no reader
    stderr = process.stderr.read()
    process.wait(timeout=300)
    assert stderr == "" and process.returncode == 141, (process.returncode, stderr)


def _raising(error: BaseException):
    def command(args):
        raise error
    return command


def test_ctrl_c_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr("mnngpu.apps.commands.inspect.run", _raising(KeyboardInterrupt()))
    assert cli.main(["inspect", "any"]) == 130
    assert capsys.readouterr().err == "error: interrupted\n"


def test_a_bug_is_one_line_unless_debugging(monkeypatch, capsys):
    monkeypatch.setattr("mnngpu.apps.commands.inspect.run", _raising(RuntimeError("boom\nsecond line")))
    assert cli.main(["inspect", "any"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: internal error: RuntimeError: boom second line")
    with pytest.raises(RuntimeError):
        cli.main(["--debug", "inspect", "any"])
