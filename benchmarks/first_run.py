"""The first `mnngpu run` after `pip install` into a new venv, on the demo model: seconds and peak RSS.

Each case installs the package from a wheel of this checkout into a venv of its own, so the
package's files are a fresh copy at a new path, as after a user's `pip install` (numba names its
cache folders after the source files' paths). The cases:
- empty cache: nothing compiled on this machine yet;
- another venv's cache: the cache holds the kernels another venv of this version compiled;
- another version's cache: the cache holds the kernels of another version (a wheel of this
  checkout with one kernel source changed and another version number).
A case's run counts from the command's start to its exit; the background compile it leaves is
waited for before the next case, so that one case's compile does not slow the next.

Every venv gets the same dependencies: mnngpu's own, installed once into a venv of their own by
pip from the configured index, then given to each new venv by a .pth file (installing them again
would only time pip). --deps SITE_PACKAGES uses an existing folder instead (offline; its extra
packages may change the figures: numba imports scipy where it finds it).

    python -m benchmarks.first_run [--workdir DIR] [--deps SITE_PACKAGES] [--rep N]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import cpu_description
from mnngpu import mapped_folders

CHECKOUT = Path(__file__).resolve().parent.parent
PROMPT = "What colour is a crow?"   # the README's first command
DEMO_REPLY = "The colour of a crow is black."
SOURCES = ("pyproject.toml", "README.md", "mnngpu", *mapped_folders.MAPPED.values())
# another version: one kernel source changed, so every kernel digest and cache stamp differs
OTHER_VERSION_EDIT = ("backends/cpu/kernels/fastmath.py", "\n# another version of this file\n")


def build_wheel(workdir: Path, name: str, other_version: bool = False) -> Path:
    """A wheel of this checkout (copied first, so that the build leaves nothing in the checkout)."""
    source = workdir / f"src-{name}"
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    for item in SOURCES:
        copy = shutil.copytree if (CHECKOUT / item).is_dir() else shutil.copy2
        copy(CHECKOUT / item, source / item, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                                if copy is shutil.copytree else {}))
    if other_version:
        project = source / "pyproject.toml"
        project.write_text(re.sub(r'^version = "([^"]+)"', r'version = "\1.post1"', project.read_text(), count=1,
                                  flags=re.MULTILINE))
        path, extra = OTHER_VERSION_EDIT
        with open(source / path, "a") as edited:
            edited.write(extra)
    wheels = workdir / f"wheel-{name}"
    shutil.rmtree(wheels, ignore_errors=True)
    _pip(sys.executable, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source))
    return next(wheels.glob("*.whl"))


def dependencies(workdir: Path, wheel: Path) -> Path:
    """site-packages of a venv holding mnngpu's dependencies only (pip installs the wheel, then removes it)."""
    venv = workdir / "deps-venv"
    site = _site_packages(venv)
    if not (site / "numba").is_dir():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        _pip(str(venv / "bin" / "python"), "install", str(wheel))
        _pip(str(venv / "bin" / "python"), "uninstall", "-y", "mnngpu")
    return site


def new_venv(path: Path, wheel: Path, deps: Path) -> Path:
    """A new venv at `path` with the wheel installed in it; its dependencies come from `deps`."""
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    (_site_packages(path) / "mnngpu-deps.pth").write_text(f"{deps}\n")
    _pip(str(path / "bin" / "python"), "install", "--no-deps", "--ignore-installed", str(wheel))
    return path


def first_run(venv: Path, cache: Path) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of `mnngpu run` on the demo model with this cache; the reply checked."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop("MNNGPU_BACKGROUND_COMPILE", None)
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        # started in the venv, as a user's shell would be: not in this checkout, which holds a package too
        process = subprocess.Popen([str(venv / "bin" / "mnngpu"), "run", "-p", PROMPT], stdout=out,
                                   stderr=subprocess.STDOUT, env=env, cwd=venv)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if process.returncode != 0 or DEMO_REPLY not in text:
        raise SystemExit(f"{venv}: mnngpu run failed (exit {process.returncode}):\n{text[-2000:]}")
    return seconds, usage.ru_maxrss / 1024


def wait_for_background(cache: Path) -> None:
    """Wait until no background compile (python -m mnngpu.jit) fills a folder of this cache."""
    setting = f"NUMBA_CACHE_DIR={cache}{os.sep}".encode()   # the process's folder is one inside it
    while True:
        busy = False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
                environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            busy |= b"mnngpu.jit" in command and any(entry.startswith(setting) for entry in environment)
        if not busy:
            return
        time.sleep(0.5)


def measure(workdir: Path, wheel: Path, other: Path, deps: Path, rep: int) -> dict[str, list]:
    figures: dict[str, list] = {"empty cache": [], "another venv's cache": [], "another version's cache": [],
                                "(warm cache, for reference)": []}
    for i in range(rep):
        cache = workdir / f"cache-{i}"
        shutil.rmtree(cache, ignore_errors=True)
        mine = new_venv(workdir / f"venv-{i}-a", wheel, deps)
        figures["empty cache"].append(first_run(mine, cache))
        wait_for_background(cache)
        figures["(warm cache, for reference)"].append(first_run(mine, cache))
        figures["another venv's cache"].append(first_run(new_venv(workdir / f"venv-{i}-b", wheel, deps), cache))
        wait_for_background(cache)

        cache = workdir / f"cache-{i}-other"
        shutil.rmtree(cache, ignore_errors=True)
        first_run(new_venv(workdir / f"venv-{i}-other", other, deps), cache)
        wait_for_background(cache)
        figures["another version's cache"].append(first_run(new_venv(workdir / f"venv-{i}-c", wheel, deps), cache))
        wait_for_background(cache)
    return figures


def report(figures: dict[str, list]) -> None:
    print(cpu_description())
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (the machine may be shared)")
    print("\n| first `mnngpu run` of a new venv | seconds | peak RSS (MB) |\n|---|---:|---:|")
    for case, runs in figures.items():
        seconds = ", ".join(f"{s:.2f}" for s, _ in runs)
        rss = ", ".join(f"{m:.0f}" for _, m in runs)
        print(f"| {case} | {seconds} | {rss} |")


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _pip(python: str, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--python", python, "-q", *args], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"pip {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="where the wheels, venvs and caches go (default: a temp folder)")
    parser.add_argument("--deps", type=Path, help="a site-packages folder with mnngpu's dependencies")
    parser.add_argument("--rep", type=int, default=1, help="new venvs and caches per case (default: 1)")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mnngpu-first-run-"))
    workdir.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(workdir, "this")
    other = build_wheel(workdir, "other", other_version=True)
    deps = args.deps or dependencies(workdir, wheel)
    report(measure(workdir, wheel, other, deps, args.rep))


if __name__ == "__main__":
    main()
