"""Shared test helpers: the fixture models and the backends this machine can run."""

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


def reference(name: str) -> tuple[dict, np.ndarray]:
    folder = FIXTURES / name
    return json.loads((folder / "reference.json").read_text()), np.load(folder / "first_logits.npy")


def backend_or_skip(backend_type: str):
    """Create the backend, or skip the test with the reason it is unavailable here."""
    from mnngpu.backend import BackendConfig, create_backend
    from mnngpu.errors import BackendUnavailableError

    try:
        return create_backend(backend_type, BackendConfig(precision="high", thread_num=2))
    except BackendUnavailableError as exc:
        pytest.skip(f"{backend_type} unavailable: {exc}")


@pytest.fixture(params=BACKENDS)
def backend_type(request) -> str:
    backend_or_skip(request.param)
    return request.param
