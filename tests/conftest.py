"""Shared test helpers: the fixture models and the backends this machine can run.

MNNGPU_REQUIRE=opencl,vulkan,chromium (set by .ci/run) names backends whose driver must be present,
and `chromium` the browser the chat page's tests drive: a test skipped because one of them is
unavailable (no device, no driver package, no browser) fails instead, so a broken PoCL, lavapipe
or Chromium install turns CI red rather than quietly skipping its tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
# The suite tests the compiled kernels; tests/test_jit.py runs the cold-start stand-ins itself.
os.environ.setdefault("MNNGPU_BACKGROUND_COMPILE", "0")

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"
MODEL_NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "reference.json").exists())
BACKENDS = ["cpu", "opencl", "vulkan", "cuda"]
REQUIRE_ENV = "MNNGPU_REQUIRE"
# The Python package each backend's driver binding comes from (what importorskip names); chromium's
# is the one that drives the browser.
BINDINGS = {"opencl": "pyopencl", "vulkan": "vulkan", "cuda": "cupy", "chromium": "selenium"}


def required_backends() -> list[str]:
    return [name.strip() for name in os.environ.get(REQUIRE_ENV, "").split(",") if name.strip()]


def unavailable_backend(reason: str) -> str | None:
    """The required backend a skip reason says is missing, if any."""
    text = reason.lower()
    for name in required_backends():
        if f"{name} unavailable" in text or f"import '{BINDINGS.get(name, name)}'" in text:
            return name
    return None


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail_required_skip(report) -> None:
    if not report.skipped:
        return
    reason = _skip_reason(report)
    name = unavailable_backend(reason)
    if name is not None:
        report.outcome = "failed"
        report.longrepr = f"{REQUIRE_ENV} names {name}, but the test was skipped: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_required_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_required_skip(outcome.get_result())


def reference(name: str) -> tuple[dict, np.ndarray]:
    folder = FIXTURES / name
    return json.loads((folder / "reference.json").read_text()), np.load(folder / "first_logits.npy")


def hf_dir(name: str) -> Path:
    """A fixture's HF source: its own hf/, or for a newer-format export (a C4 fixture) the hf/ of the
    fixture it was exported from (reference.json's hf_from)."""
    source = json.loads((FIXTURES / name / "reference.json").read_text()).get("hf_from", name)
    return FIXTURES / source / "hf"


def skip_unavailable(backend_type: str, why: object):
    """Skip a test for want of something `backend_type` needs here (a driver, a device feature, its
    shader compiler), worded so that MNNGPU_REQUIRE naming the backend turns the skip into a failure."""
    pytest.skip(f"{backend_type} unavailable: {why}")


def backend_or_skip(backend_type: str):
    """Create the backend, or skip the test with the reason it is unavailable here."""
    from mnngpu.backend import BackendConfig, create_backend
    from mnngpu.errors import BackendUnavailableError

    try:
        return create_backend(backend_type, BackendConfig(precision="high", thread_num=2))
    except BackendUnavailableError as exc:
        skip_unavailable(backend_type, exc)


@pytest.fixture(params=BACKENDS)
def backend_type(request) -> str:
    backend_or_skip(request.param)
    return request.param


def load_multimodal(folder, backend_type: str):
    """A vision or audio fixture loaded with its LLM and its processor graphs on `backend_type`
    at precision high."""
    from mnngpu import llm as mnngpu_llm

    settings = {"backend_type": backend_type, "precision": "high", "thread_num": 2}
    model = mnngpu_llm.create(folder)
    model.set_config({**settings, "mllm": settings})
    model.load()
    return model


def copy_model_files(source: Path, dest: Path, names, skip=(), **llm_config) -> Path:
    """A copy of a fixture's model files `names` (less `skip`) in dest/model, with llm_config
    keys changed; the tests that must not touch the fixture itself use it."""
    import shutil

    folder = dest / "model"
    folder.mkdir()
    for name in names:
        if name not in skip:
            shutil.copy2(source / name, folder / name)
    if llm_config:
        path = folder / "llm_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **llm_config}))
    return folder


def folder_state(folder: Path) -> dict[str, tuple[int, int]]:
    """Each file's (size, mtime): equal before and after a run when nothing was written there."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}
