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

from mnngpu.apps.cli import build_parser, main
from mnngpu.progress import LoadProgress, format_bar
from tests.conftest import FIXTURES, reference
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


def test_run_with_the_folders_eagle_head_streams_mnns_greedy_reply(capsys):
    """The eagle fixture's llm_config asks for speculative_type eagle: `run` uses it and says how it went."""
    from tokenizers import Tokenizer

    folder = FIXTURES / "qwen2_eagle3_int4"
    prompt = reference(folder.name)[0]["prompts"][1]
    ids = prompt["greedy"][:16]
    assert min(ids) >= 3   # no special token (ids 0-2) in the reply
    code = main(["run", str(folder), *CLI_ORACLE_FLAGS, "--sampler", "greedy", "-p", prompt["text"],
                 "--no-template", "-n", "16"])
    out, err = capsys.readouterr()
    text = Tokenizer.from_file(str(folder / "hf" / "tokenizer.json")).decode(ids, skip_special_tokens=False)
    assert code == 0 and out == text + "\n"
    assert re.search(r"^eagle: [0-9.]+ % of drafts accepted, [0-9.]+ tokens per decode forward$", err, re.MULTILINE)


def test_run_reads_config_overrides(capsys):
    code, _, err = run_cli(capsys, "-p", RAW_PROMPT, "--no-template", "--config", "max_new_tokens=3")
    assert code == 0 and stat(err, "decode tokens num") == len(greedy_reply(RAW_PROMPT, 3)[0])


@pytest.mark.parametrize(("args", "message"), [
    (["--config", "no_equals_sign"], "expected KEY=VALUE"),
    (["--backend", "abacus"], "abacus"),
    (["--config", "temperature=-1", "--sampler", "temperature"], "temperature"),
    (["--config", "speculative_type=mtp"], "'mtp' needs mtp.mnn (mtp_model) in the model folder"),
    (["--speculative", "eagle"], "'eagle' needs eagle.mnn (eagle_model) in the model folder"),
])
def test_run_reports_a_bad_setting_in_one_line(capsys, args, message):
    code = main(["run", str(MODEL_DIR), "-p", "x", "-n", "1", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err
    assert [line for line in err.splitlines() if line.startswith("error: ")] == err.strip().splitlines()[-1:]


@pytest.mark.parametrize("command", ["run", "bench"])
def test_speculative_offers_only_the_strategies_mnngpu_runs(capsys, command):
    """mtp and dflash are refused at load (generation/factory.py), so the flag does not offer them;
    set through --config they still get the load's one-line refusal (above)."""
    from mnngpu.generation.factory import SPECULATIVE_CHOICES

    parser = build_parser()._subparsers._group_actions[0].choices[command]
    flag = next(action for action in parser._actions if "--speculative" in action.option_strings)
    assert tuple(flag.choices) == ("lookahead", "eagle") and set(flag.choices) <= set(SPECULATIVE_CHOICES)
    for refused in ("mtp", "dflash"):
        assert main([command, str(MODEL_DIR), "--speculative", refused]) == 2
        err = capsys.readouterr().err
        assert f"invalid choice: '{refused}'" in err and err.count("\n") == 1


def test_serve_help_says_requests_wait_for_a_slot_not_behind_one_running_request():
    from mnngpu.generation.batch import DEFAULT_SLOTS

    parser = build_parser()._subparsers._group_actions[0].choices["serve"]
    helps = {action.dest: action.help for action in parser._actions}
    assert "wait for a slot" in helps["max_queue"] and "running one" not in helps["max_queue"]
    assert f"default: {DEFAULT_SLOTS} where the model and backend batch" in helps["parallel"]


def test_serve_without_its_extra_names_every_package_the_extra_installs(capsys, monkeypatch):
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    packages = [re.split(r"[<>=\[ ]", spec)[0] for spec in pyproject["project"]["optional-dependencies"]["serve"]]
    monkeypatch.setitem(sys.modules, "uvicorn", None)   # `import uvicorn` fails, as without mnngpu[serve]
    assert main(["serve", str(MODEL_DIR)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "(uvicorn is missing)" in err
    assert all(package in err for package in packages) and "pip install 'mnngpu[serve]'" in err


def test_without_a_model_folder_run_uses_the_bundled_demo_model(capsys):
    from mnngpu.demo import DEMO_MODEL_DIR

    assert (DEMO_MODEL_DIR / "config.json").is_file()   # shipped inside the package
    code = main(["run", "-p", "Once upon a time", "-n", "4"])
    assert code == 0 and "ready: mnngpu-demo (" in capsys.readouterr().err


def test_a_missing_demo_model_is_one_error_naming_its_config(monkeypatch, tmp_path, capsys):
    from mnngpu import demo

    monkeypatch.setattr(demo, "DEMO_MODEL_DIR", tmp_path / "model")
    code = main(["run", "-p", "Once upon a time", "-n", "4"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and str(tmp_path / "model" / "config.json") in err


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


# ---- what a new user meets first -----------------------------------------------------------------------------

DEMO_FLAGS = [*CLI_ORACLE_FLAGS, "--sampler", "greedy"]
STORY_REQUEST = "Tell me a long story"


def demo_mnn_text(prompt: str, steps: int, tmp_path: Path) -> str:
    """MNN's own greedy continuation of `prompt` on the demo model, special tokens and all."""
    import json

    from mnngpu.demo import DEMO_MODEL_DIR
    from mnngpu.tokenizer import load_tokenizer

    out = tmp_path / "mnn.json"
    subprocess.run([sys.executable, str(Path(__file__).parent / "mnn_oracle.py"), str(DEMO_MODEL_DIR),
                    "--prompts-json", json.dumps([prompt]), "--steps", str(steps), "--json-out", str(out)],
                   check=True, capture_output=True, timeout=120)
    ids = json.loads(out.read_text())["prompts"][0]["greedy"]
    tokenizer = load_tokenizer(DEMO_MODEL_DIR, "tokenizer.mtok")
    return "".join(tokenizer.decode(i) for i in ids)


def demo_chat_prompt(text: str) -> str:
    """The demo's chat template, rendered by jinja2 itself."""
    import json

    import jinja2

    from mnngpu.demo import DEMO_MODEL_DIR

    template = json.loads((DEMO_MODEL_DIR / "llm_config.json").read_text())["jinja"]["chat_template"]
    return jinja2.Template(template).render(messages=[{"role": "user", "content": text}], add_generation_prompt=True)


def test_run_prints_no_chat_markup_and_stops_at_the_end_of_the_turn(capsys, tmp_path):
    pytest.importorskip("MNN")
    mnn = demo_mnn_text(demo_chat_prompt(STORY_REQUEST), 40, tmp_path)
    assert mnn.startswith("<|im_start|>assistant\n")  # the demo writes the turn's opening again
    turn = mnn.split("<|im_end|>")[0]
    assert main(["run", "-p", STORY_REQUEST, *DEMO_FLAGS]) == 0
    assert capsys.readouterr().out == turn.removeprefix("<|im_start|>assistant\n") + "\n"
    assert main(["run", "-p", STORY_REQUEST, *DEMO_FLAGS, "--show-special"]) == 0
    assert capsys.readouterr().out == turn + "\n"


def test_run_stops_at_end_of_text_though_mnns_stop_ids_do_not(capsys):
    from tests.reference_model import hf_tokenizer, recorded, stop_ids

    text = "café 日本語 👍🏽 12345"
    greedy = recorded(text)["greedy"]
    end_of_text = hf_tokenizer().token_to_id("<|endoftext|>")
    assert end_of_text in greedy and end_of_text not in stop_ids()
    before = greedy[:greedy.index(end_of_text)]
    code, out, err = run_cli(capsys, "-p", text, "--no-template", "-n", "16")
    assert code == 0 and out == hf_tokenizer().decode(before) + "\n"
    assert stat(err, "decode tokens num") == len(before)


def test_run_without_p_reads_a_piped_prompt_and_its_help_names_the_default():
    done = subprocess.run([sys.executable, "-m", "mnngpu", "run", str(MODEL_DIR), *CLI_ORACLE_FLAGS, "--sampler",
                           "greedy", "--no-template", "-n", "8"], input=RAW_PROMPT + "\n", capture_output=True,
                          text=True, timeout=120, check=False, errors="replace")
    assert done.returncode == 0, done.stderr
    assert done.stdout == greedy_reply(RAW_PROMPT, 8)[1] + "\n"
    assert stat(done.stderr, "prompt tokens num") == hf_count(RAW_PROMPT)
    run_help = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "Once upon a time" in run_help and "stdin" in run_help


def test_seed_is_no_unknown_key_and_makes_sampling_repeatable(capsys):
    replies = []
    for _ in range(2):
        code, out, err = run_cli(capsys, "-p", RAW_PROMPT, "--no-template", "-n", "8", "--sampler", "temperature",
                                 "--temperature", "1.5", "--seed", "11")
        assert code == 0 and not [line for line in err.splitlines() if line.startswith("warning") and "seed" in line]
        replies.append(out)
    assert replies[0] == replies[1]


def test_a_bad_command_line_setting_is_blamed_on_its_key_alone(capsys):
    code, _, err = run_cli(capsys, "-p", "x", "--config", "max_all_tokens=0")
    assert code == 2 and err.splitlines()[-1] == "error: max_all_tokens: expected an integer >= 1, got 0"
    code, _, err = run_cli(capsys, "-p", "x", "-n", "1", "--config", "max_al_tokens=9")
    assert "warning: max_al_tokens: not a key MNN reads" in err and "set_config()" not in err


def copy_of_fixture(tmp_path: Path) -> Path:
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(MODEL_DIR, folder, ignore=shutil.ignore_patterns("hf"))
    return folder


def test_a_text_file_named_llm_mnn_is_not_an_mnn_model_file(capsys, tmp_path):
    folder = copy_of_fixture(tmp_path)
    (folder / "llm.mnn").write_text("this is a text file\n")
    assert main(["inspect", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {folder / 'llm.mnn'}: Net: not an MNN model file") and err.count("\n") == 1


def test_ready_is_printed_only_once_the_tokenizer_has_loaded(capsys, tmp_path):
    import json

    folder = copy_of_fixture(tmp_path)
    tokenizer_file = json.loads((folder / "config.json").read_text())["tokenizer_file"]
    (folder / tokenizer_file).write_bytes(b"not a tokenizer")
    assert main(["run", str(folder), "-p", "x", "-n", "1"]) == 2
    err = capsys.readouterr().err
    assert "ready:" not in err and tokenizer_file in err.splitlines()[-1]


def test_inspect_without_a_folder_inspects_the_demo_model(capsys):
    import json

    from mnngpu.demo import DEMO_MODEL_DIR

    assert main(["inspect", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == str(DEMO_MODEL_DIR)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "mnngpu/demo/model/" in readme and (DEMO_MODEL_DIR / "config.json").is_file()


def test_debug_is_accepted_after_the_subcommand(tmp_path):
    from mnngpu.errors import ConfigError

    with pytest.raises(ConfigError):  # --debug lets the error through, with its traceback
        main(["inspect", str(tmp_path / "missing"), "--debug"])


def test_forward_returns_the_logits_object_the_readme_names():
    import numpy as np

    from mnngpu.llm import Logits

    logits = load_model().forward([5, 6])
    assert isinstance(logits, Logits) and isinstance(logits, np.ndarray) and logits.shape[:2] == (1, 1)
    np.testing.assert_array_equal(logits.read(), np.asarray(logits))
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "a Logits object: a numpy float32 array [1, 1, vocab]" in readme
