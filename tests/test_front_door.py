"""What a new user sees from `mnngpu run`: no warning on a model folder as exported, a warning
naming its source for a value the user set that changes nothing, and a notice of kernels
compiling for the first time that comes before the reply, never inside it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from mnngpu import jit, llm
from mnngpu.config import ConfigWarning
from tests.conftest import FIXTURES
from tests.test_jit import _background_workers

FIXTURE_ROOT = FIXTURES.parent
EXPORTED = sorted(folder for kind in ("models", "vision", "audio") for folder in (FIXTURE_ROOT / kind).iterdir()
                  if (folder / "config.json").is_file())
MODEL = FIXTURES / "qwen2_int4_b64"
PROMPT = "Once upon a time"


def mnngpu(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mnngpu", *args], capture_output=True, text=True, timeout=600,
                          env=env, check=False)


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


@pytest.mark.parametrize("folder", EXPORTED, ids=lambda folder: f"{folder.parent.name}/{folder.name}")
def test_run_on_an_exported_folder_prints_no_warning(folder):
    done = mnngpu("run", str(folder), "-p", "hi", "-n", "2")
    assert done.returncode == 0, done.stderr
    assert warning_lines(done.stderr) == []


def test_a_notice_of_kernels_compiling_comes_first_and_never_splits_the_reply(tmp_path):
    greedy = ("run", str(MODEL), "-p", PROMPT, "-n", "12", "--sampler", "greedy")
    compiled = mnngpu(*greedy)           # the suite's warm cache, compiled in the foreground
    assert compiled.returncode == 0, compiled.stderr
    cold = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), jit.ENV_SWITCH: "1"}
    try:
        first = mnngpu(*greedy, env=cold)
    finally:
        deadline = time.monotonic() + 900   # leave no compile running behind the test
        while _background_workers(tmp_path) and time.monotonic() < deadline:
            time.sleep(1)
    assert first.returncode == 0, first.stderr
    # the reply is streamed whole: the same text as the compiled kernels', one line break at its end
    assert first.stdout == compiled.stdout and first.stdout.count("\n") == 1
    lines = first.stderr.splitlines()
    assert lines[0].startswith("note: compiling kernels in the background: "), first.stderr
    count = int(lines[0].split(": ")[2].split()[0])
    assert count > 0 and "for the first time" in lines[0]
    assert lines[1].startswith("ready: ") and warning_lines(first.stderr) == []


def exported_copy(tmp_path: Path, **config) -> Path:
    folder = tmp_path / MODEL.name
    shutil.copytree(MODEL, folder)
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return folder


def test_a_value_set_in_a_file_that_changes_nothing_names_the_file_and_key(tmp_path):
    folder = exported_copy(tmp_path, **{"async": False, "memory": "high", "power": "high"})
    done = mnngpu("run", str(folder), "-p", "hi", "-n", "1")
    assert done.returncode == 0, done.stderr
    # memory and power tune MNN's runtime and come with exports: a folder's own value is silent
    want = f"warning: {folder / 'config.json'}: async: false has no effect in mnngpu: MNN's asynchronous decode (speed only)"
    assert warning_lines(done.stderr) == [want]


def test_a_flag_that_changes_nothing_is_named():
    done = mnngpu("run", str(MODEL), "-p", "hi", "-n", "1", "--config", "memory=high")
    assert done.returncode == 0, done.stderr
    want = ('warning: memory: "high" has no effect in mnngpu: MNN\'s weight and activation storage choice '
            "(memory and speed); set by --config")
    assert warning_lines(done.stderr) == [want]


def test_set_config_that_changes_nothing_is_named():
    model = llm.create(MODEL)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.set_config({"dynamic_option": 2})
    texts = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(texts) == 1 and texts[0].startswith("set_config(): dynamic_option: 2 has no effect in mnngpu")


def test_bench_names_its_memory_flag():
    from mnngpu.apps import bench

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bench.load_model(bench.RuntimeCase(MODEL, "cpu", "high", "high", 1))
    texts = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    want = ('memory: "high" has no effect in mnngpu: MNN\'s weight and activation storage choice '
            "(memory and speed); set by --memory")
    assert texts == [want]


class _Recorder:
    """A stream that records what is written to it, in order with the notices."""

    def __init__(self, events: list, name: str):
        self.events, self.name = events, name

    def write(self, text: str) -> None:
        self.events.append((self.name, text))

    def flush(self) -> None:
        pass


def test_chat_says_a_notice_after_the_reply_it_arrived_in():
    from mnngpu.apps.commands.chat import chat_loop

    events: list = []

    class Session:
        def make_room(self, text):
            return 0

        def ask(self, text, on_text):
            on_text("Once")
            jit.BACKGROUND.unannounced.append(jit.Job("m", "kernel", sig=("float32",)))  # a kernel a reply met
            on_text(" upon")

    lines = iter(["hello", "/exit"])
    jit.hold_notices()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda message, *rest, **kw: events.append(("note", str(message)))
            chat_loop(Session(), lambda prompt: next(lines), _Recorder(events, "out"), _Recorder(events, "err"))
    finally:
        jit.hold_notices(False)
    kinds = [kind for kind, _ in events]
    reply_end = max(i for i, (kind, text) in enumerate(events) if kind == "out" and text == "\n")
    assert kinds.count("note") == 1 and kinds.index("note") == reply_end + 1, events
    assert "".join(text for kind, text in events[:reply_end + 1] if kind == "out") == "\nA: Once upon\n"
    assert events[reply_end + 1][1].startswith("compiling kernels in the background: 1 ")


# ---- what the README and docs/server.md tell a new user ------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def doc_section(doc: str, title: str) -> str:
    text = (ROOT / doc).read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def server_routes() -> list[str]:
    """`METHOD /path` of every route the server's app answers, a path parameter written {id}."""
    pytest.importorskip("starlette")
    from mnngpu.apps.server.app import create_app
    from mnngpu.apps.server.models import ModelSlot

    app = create_app(ModelSlot()).app   # inside the access log
    return [f"{method} {re.sub(r'{[^}]*}', '{id}', route.path)}" for route in app.routes
            for method in sorted(route.methods - {"HEAD"})]


def test_the_readme_and_the_server_docs_name_every_route_the_server_answers():
    routes = server_routes()
    assert {"GET /health", "GET /metrics", "POST /tokenize", "POST /detokenize", "GET /tokenizer_info"} <= set(routes)
    for doc, text in (("README.md", doc_section("README.md", "Server")),
                      ("docs/server.md", doc_section("docs/server.md", "Endpoints"))):
        assert [route for route in routes if f"`{route}`" not in text] == [], doc


def test_the_readme_says_the_server_generates_several_replies_at_once():
    from mnngpu.generation.batch import DEFAULT_SLOTS

    server = " ".join(doc_section("README.md", "Server").split())
    assert "one request at a time" not in server
    assert f"up to {DEFAULT_SLOTS} replies at once (`--parallel` slots" in server and "continuous batching" in server


def test_the_quick_starts_vulkan_lines_name_the_extra_they_need():
    quick = doc_section("README.md", "Quick start")
    block = quick.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].split()[:2] for line in block.splitlines() if "vulkan" in line] == [
        ["mnngpu", "inspect"], ["mnngpu", "diff"]]
    after = " ".join(quick.split("```", 2)[2].split())
    assert after.startswith("The last two run the model on Vulkan, so they need the `[vulkan]` extra "
                            "(`pip install 'mnngpu[vulkan]'`)")


def test_the_server_docs_say_the_n_choices_run_in_slots_of_their_own_seeded_seed_plus_index():
    text = (ROOT / "docs" / "server.md").read_text(encoding="utf-8")
    prose = text.split("<!-- request-fields:start -->", 1)[0] + text.split("<!-- request-fields:end -->", 1)[1]
    prose = " ".join(prose.split())
    assert "one random stream" not in prose and "generated one after another" not in prose
    assert "the choice whose `index` is `i` is seeded `seed + i`" in prose
    assert "`n` choices, each in a slot of its own" in prose


def test_runs_speed_figures_say_a_short_reply_is_not_a_steady_measure():
    short = mnngpu("run", str(MODEL), "-p", PROMPT, "-n", "4", "--sampler", "greedy", "--no-template")
    steady = mnngpu("run", str(MODEL), "-p", PROMPT, "-n", "40", "--sampler", "greedy", "--no-template",
                    "--config", "ignore_eos=true")
    assert short.returncode == 0 and steady.returncode == 0, short.stderr + steady.stderr
    assert "decode tokens num = 4" in short.stderr and "4 tokens time too little" in short.stderr
    assert "decode tokens num = 40" in steady.stderr and "time too little" not in steady.stderr


def test_the_ready_line_names_the_demo_and_a_hub_snapshot_by_what_they_are(tmp_path):
    demo = mnngpu("run", "-p", "hi", "-n", "1")
    snapshot = tmp_path / "hub" / "models--some-org--tiny-qwen" / "snapshots" / ("0" * 40)
    shutil.copytree(MODEL, snapshot)
    cached = mnngpu("run", str(snapshot), "-p", "hi", "-n", "1")
    plain = mnngpu("run", str(MODEL), "-p", "hi", "-n", "1")
    assert demo.stderr.startswith("ready: mnngpu-demo ("), demo.stderr
    assert cached.stderr.startswith("ready: some-org/tiny-qwen ("), cached.stderr
    assert plain.stderr.startswith(f"ready: {MODEL.name} ("), plain.stderr
