"""The real-width models (tools/make_width_models.py), built once and cached between runs.

They are 100+ MB each, too big to commit, so the first run builds them (one to two minutes for the
three on 2 cores: random HF weights, MNN's real exporter, MNN's runtime recording them) into
MNNGPU_TEST_CACHE (default ~/.cache/mnngpu-tests)/width-models-<hash>, where <hash> covers every
file the build reads, so a changed build script makes a fresh set. Without the `fixtures` extra
(torch, transformers, llmexport) or the `mnn` wheel the tests that need them skip with that reason.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_INPUTS = [REPO / "tools" / name for name in ("make_width_models.py", "make_fixtures.py", "mnn_export.py",
                                                    "corpus.py")] + [REPO / "tests" / "mnn_oracle.py"]
BUILD_NEEDS = ("torch", "transformers", "llmexport", "MNN")
BUILD_TIMEOUT_S = 1200


def width_models_key() -> str:
    digest = hashlib.sha256()
    for path in BUILD_INPUTS:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get("MNNGPU_TEST_CACHE", Path.home() / ".cache" / "mnngpu-tests"))


def build_width_models(dest: Path) -> None:
    """Build every shape into a sibling folder, then rename it into place (a run killed halfway
    leaves no half-built cache behind)."""
    partial = dest.with_name(dest.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "tools.make_width_models", str(partial)], cwd=REPO,
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"tools/make_width_models.py failed (exit {done.returncode}):\n"
                           f"{done.stdout[-2000:]}{done.stderr[-4000:]}")
    (partial / "build_seconds.txt").write_text(done.stdout)
    try:
        partial.rename(dest)
    except OSError:
        if not dest.is_dir():
            raise
        shutil.rmtree(partial)   # another test run built the same set meanwhile


@pytest.fixture(scope="session")
def width_models() -> Path:
    """The folder holding one real-width model folder per tools/make_width_models.SPECS entry."""
    missing = [name for name in BUILD_NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"the real-width models are built at test time and need {', '.join(missing)} "
                    "(pip install -e '.[fixtures,test]')")
    dest = cache_root() / f"width-models-{width_models_key()}"
    if not dest.is_dir():
        dest.parent.mkdir(parents=True, exist_ok=True)
        build_width_models(dest)
    return dest
