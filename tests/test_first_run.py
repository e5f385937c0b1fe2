"""The first `mnngpu run` of a new install, on a machine whose kernel cache another install filled.

numba names a source folder's cache after its path, so a second venv (or an upgrade) finds none of
its kernels in the cache even where the other install's are there; its first run must then start
on the numpy stand-ins and compile in the background, as on an empty cache, and not take the other
install's records for its own and compile in the foreground. Two copies of this package at two
paths play the two installs; numba's own compile events count what each run compiled in its
process (the background process is another one)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import mnngpu
from mnngpu import jit, mapped_folders
from tests.test_jit import _background_workers

PROMPT = "What colour is a crow?"   # the README's first command
DEMO_REPLY = "The colour of a crow is black."   # MNN's own reply: tests/test_demo_model.py checks it

# `mnngpu run` with a listener on numba's compile event: the kernels this process compiled itself
RUN_CLI = textwrap.dedent("""
    import json, os, sys
    from numba.core import event

    compiled = []

    class Compiles(event.Listener):
        def on_start(self, ev):
            compiled.append(ev.data["dispatcher"].py_func.__qualname__)

        def on_end(self, ev):
            pass

    event.register("numba:compile", Compiles())
    import mnngpu
    from mnngpu.apps.cli import main

    code = main(sys.argv[1:])
    with open(os.environ["RUN_REPORT"], "w") as report:
        json.dump({"code": code, "compiled": compiled, "package": mnngpu.__file__,
                   "kernels": sys.modules["mnngpu.backends.cpu.ops.norm"].__file__}, report)
""")


def _install_copy(folder: Path) -> Path:
    """A copy of this package at `folder`/mnngpu, laid out as a wheel installs it."""
    package = Path(mnngpu.__file__).parent
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(package, folder / "mnngpu", ignore=ignore)
    for mapped, name in mapped_folders.MAPPED.items():   # a checkout keeps these beside the package
        if not (folder / "mnngpu" / name).exists():
            shutil.copytree(mapped_folders.folder(mapped, package), folder / "mnngpu" / name, ignore=ignore)
    return folder


def _first_run(install: Path, cache: Path, folder: Path) -> dict:
    """`mnngpu run` of the install at `install`, started in `folder`."""
    report, script = install / "report.json", install / "run_cli.py"
    script.write_text(RUN_CLI)      # the script's folder, not the current one, is first on its path
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), jit.ENV_SWITCH: "1", "RUN_REPORT": str(report)}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, str(script), "run", "-p", PROMPT], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(report.read_text())
    assert Path(result["package"]).is_relative_to(install) and Path(result["kernels"]).is_relative_to(install)
    assert DEMO_REPLY in done.stdout
    return {**result, "stderr": done.stderr}


def _wait_for_background(cache: Path) -> None:
    deadline = time.monotonic() + 900      # a bound on the wait, not a speed check
    while _background_workers(cache) and time.monotonic() < deadline:
        time.sleep(1)
    assert not _background_workers(cache)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc to find the background process")
def test_a_cache_another_install_filled_adds_no_foreground_compile(tmp_path):
    cache = tmp_path / "cache"
    one, other = _install_copy(tmp_path / "one"), _install_copy(tmp_path / "other")
    # started in a folder that holds another copy (a checkout, say): its background compile must
    # still compile this run's own package
    first = _first_run(one, cache, folder=other)
    assert "the tokenizer's" in first["stderr"]         # its tokenizer kernels went to the background
    assert "note: compiling kernels in the background" in first["stderr"]
    assert "_announce" not in first["stderr"]            # one line, no source line under it
    assert len(_background_workers(cache)) <= 1
    assert first["compiled"] == []                      # and every other kernel: none in the foreground
    _wait_for_background(cache)

    second = _first_run(other, cache, folder=other)
    try:
        # the other install's kernels and marks are not taken as this one's: its tokenizer and model
        # kernels go to the background as on an empty cache ...
        assert "compiling kernels in the background" in second["stderr"]
        assert "the tokenizer's" in second["stderr"]
        # ... and it compiles nothing in the foreground, as on an empty cache
        assert second["compiled"] == []
    finally:
        for pid in _background_workers(cache):    # the second install's compile: not needed here
            os.kill(int(pid), signal.SIGTERM)


# ---- pruning: the kernels of installs that are gone ---------------------------------------------

FOLDERS_OF_INSTALL = textwrap.dedent("""
    import json
    from pathlib import Path
    from mnngpu import jit
    from mnngpu.backends.cpu.ops import norm

    print(json.dumps([jit.cache_dir().name, Path(norm.norm_rows._cache._cache_path).name]))
""")


def _folders_numba_uses(install: Path, cache: Path) -> tuple[str, str]:
    """(kernels folder, numba folder of backends/cpu/ops) as the install at `install` names them
    itself, importing its kernels with this cache (which records it as an install there)."""
    done = subprocess.run([sys.executable, "-c", FOLDERS_OF_INSTALL], cwd=install, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(install), "NUMBA_CACHE_DIR": str(cache)},
                          timeout=300, check=True)
    return tuple(json.loads(done.stdout.strip().splitlines()[-1]))


def test_pruning_keeps_the_kernels_of_present_installs_only(tmp_path, monkeypatch):
    from mnngpu.backends.cpu.ops import norm

    cache = tmp_path / "cache"
    other = _install_copy(tmp_path / "other")
    with open(other / "mnngpu" / "backends" / "cpu" / "kernels" / "fastmath.py", "a") as source:
        source.write("\n# another version\n")
    other_kernels, other_ops = _folders_numba_uses(other, cache)
    assert other_kernels != jit._KERNELS_FOLDER            # another version: its own kernels folder
    mine = cache / jit._KERNELS_FOLDER / Path(norm.norm_rows._cache._cache_path).name
    stale = cache / jit._KERNELS_FOLDER / "ops_0000000000000000000000000000000000000000"  # a venv now gone
    foreign = cache / "another-program"                     # NUMBA_CACHE_DIR may be shared
    for folder in (mine, stale, foreign):
        folder.mkdir(parents=True)
    monkeypatch.setattr(jit.numba.config, "CACHE_DIR", str(cache / jit._KERNELS_FOLDER))

    jit.prune_cache()
    assert mine.is_dir() and foreign.is_dir() and (cache / other_kernels / other_ops).is_dir()
    assert not stale.exists()

    shutil.rmtree(other)                                    # the other install is uninstalled
    jit.prune_cache()
    assert not (cache / other_kernels).exists()
    assert mine.is_dir() and foreign.is_dir()
    assert [record.read_text() for record in (cache / jit.INSTALLS).iterdir()] == []


# ---- what a run imports ---------------------------------------------------------------------------

def test_a_run_imports_no_other_commands_code():
    """`mnngpu run` loads the run command only: not the server (whose packages are an extra), the
    benchmark or the inspector."""
    script = textwrap.dedent("""
        import json, sys
        from mnngpu.apps.cli import main

        try:
            main(["run", "--help"])
        except SystemExit:
            pass
        print(json.dumps(sorted(name for name in sys.modules if name.startswith("mnngpu.apps."))))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert "mnngpu.apps.commands.run" in loaded
    assert not [name for name in loaded if name.startswith(("mnngpu.apps.server", "mnngpu.apps.commands.serve",
                                                            "mnngpu.apps.bench", "mnngpu.apps.commands.bench",
                                                            "mnngpu.apps.inspect", "mnngpu.apps.diff"))], loaded


def test_without_the_serve_extra_the_help_lists_serve_and_serve_names_what_to_install():
    """A plain `pip install mnngpu` has no prometheus_client (an extra's package): every command
    still parses, and `mnngpu serve` says which extra it needs."""
    script = textwrap.dedent("""
        import sys
        sys.modules["prometheus_client"] = None     # as where it is not installed: importing it fails
        from mnngpu.apps.cli import main

        try:
            main(["--help"])
        except SystemExit as done:
            print("help exit", done.code)
        print("serve exit", main(["serve", "--port", "0"]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    assert "help exit 0" in done.stdout and "serve " in done.stdout
    assert "serve exit 2" in done.stdout
    assert "pip install 'mnngpu[serve]'" in done.stderr and "prometheus_client" in done.stderr
