"""MNNGPU_REQUIRE: a skip because a required backend is unavailable fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SKIPPING_TESTS = '''
import pytest

def test_vulkan_missing():
    pytest.skip("vulkan unavailable: no Vulkan driver")

def test_cuda_missing():
    pytest.skip("cuda unavailable: no CUDA device")
'''


def run_pytest(tmp_path: Path, require: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_skips.py").write_text(SKIPPING_TESTS)
    env = {**os.environ, "MNNGPU_REQUIRE": require, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_skips.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_required_backend_skip_fails(tmp_path):
    result = run_pytest(tmp_path, "opencl,vulkan")
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 skipped" in result.stdout
    assert "MNNGPU_REQUIRE names vulkan" in result.stdout


def test_without_the_variable_skips_stay_skips(tmp_path):
    result = run_pytest(tmp_path, "")
    assert result.returncode == 0, result.stdout
    assert "2 skipped" in result.stdout


def test_a_module_skipped_at_collection_fails(tmp_path):
    (tmp_path / "test_binding.py").write_text('import pytest\npytest.importorskip("no_such_binding_pkg")\n\n'
                                              'def test_x():\n    pass\n')
    env = {**os.environ, "MNNGPU_REQUIRE": "cuda", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", (
        "import sys, pytest, tests.conftest as c; c.BINDINGS['cuda'] = 'no_such_binding_pkg'; "
        f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--rootdir', {str(tmp_path)!r}, "
        f"{str(tmp_path / 'test_binding.py')!r}], plugins=[c]))")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode != 0, result.stdout
    assert "MNNGPU_REQUIRE names cuda" in result.stdout


# Words in a skip reason that say a required backend's driver, device or toolchain is missing.
DRIVER_WORDS = ("opencl", "vulkan", "glslc", "shaderfloat16", "lavapipe", "pocl", "cl_khr")


def test_every_skip_for_a_backend_s_needs_is_worded_for_mnngpu_require():
    """A skip whose reason names a backend's driver, device features or shader compiler goes through
    conftest.skip_unavailable (or says "<backend> unavailable"), so MNNGPU_REQUIRE catches it."""
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "pytest.skip(" in line and any(word in line.lower() for word in DRIVER_WORDS) \
                    and "unavailable" not in line:
                offenders.append(f"{path.relative_to(REPO)}:{number}")
    assert offenders == []
