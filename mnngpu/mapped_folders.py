"""The two folders of the checkout that install as subpackages of mnngpu, and where each is found.

pyproject.toml's package-dir installs backends/ as `mnngpu.backends` and shaders/ as
`mnngpu.shaders`, so the repository's top level stays pyproject.toml, mnngpu, backends, shaders,
tests, docs. A wheel puts them inside its mnngpu folder; a checkout keeps them beside it. This is
the one place that knows: the kernel cache, the tests, the tools and the benchmarks ask here, and
tests/test_layout.py checks it against pyproject.toml.
"""

from __future__ import annotations

from pathlib import Path

MAPPED = {"mnngpu.backends": "backends", "mnngpu.shaders": "shaders"}   # package -> its folder in a checkout
PACKAGE_DIR = Path(__file__).resolve().parent


def folder(package: str, package_dir: Path = PACKAGE_DIR) -> Path:
    """Where the mapped `package` of the mnngpu at `package_dir` lives: inside that folder (a wheel),
    else beside it (a checkout)."""
    name = MAPPED[package]
    inside = package_dir / name
    return inside if inside.is_dir() else package_dir.parent / name
