"""The backend contract: every registered backend offers exactly the methods mnngpu.backend.Backend
declares (what its own executions call on it is private, a leading underscore), declares one
Capabilities record, and keeps KV caches that follow backend.kv.KVCache. Every backend folder has
the same skeleton, its op table in ops/__init__.py and its Executions in files named after the
core op families (mnngpu/ops/)."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import numpy as np
import pytest

from mnngpu import mapped_folders
from mnngpu.backend import REGISTRY, Backend, Capabilities, backend_class
from mnngpu.backend.kv import KVCache
from mnngpu.errors import BackendUnavailableError
from tests.backend.harness import make

MAX_METHODS = 10
REPO = Path(__file__).resolve().parents[2]
SKELETON = {"__init__.py", "device.py", "memory.py", "ops/__init__.py", "ops/base.py"}
CORE_FAMILIES = {path.stem for path in (REPO / "mnngpu" / "ops").glob("*.py")} - {"__init__", "common", "op_table"}


def public_methods(cls: type) -> set[str]:
    return {name for name, value in inspect.getmembers(cls, callable)
            if not name.startswith("_") and not inspect.isclass(value)}


DECLARED = public_methods(Backend)


def backend_class_or_skip(backend_type: str) -> type[Backend]:
    try:
        return backend_class(backend_type)
    except BackendUnavailableError as exc:   # the backend's module cannot import its driver package
        pytest.skip(f"{backend_type} unavailable: {exc}")


def test_the_backend_abc_declares_at_most_ten_methods():
    assert len(DECLARED) <= MAX_METHODS, sorted(DECLARED)


@pytest.mark.parametrize("backend_type", sorted(REGISTRY))
def test_a_backend_offers_exactly_the_declared_methods(backend_type):
    cls = backend_class_or_skip(backend_type)
    assert issubclass(cls, Backend) and not inspect.isabstract(cls)
    offered = public_methods(cls)
    assert offered == DECLARED, {"undeclared": sorted(offered - DECLARED),
                                 "missing": sorted(DECLARED - offered)}


@pytest.mark.parametrize("backend_type", sorted(REGISTRY))
def test_a_backend_declares_its_capabilities(backend_type):
    cls = backend_class_or_skip(backend_type)
    assert cls.type == backend_type
    assert "caps" in vars(cls) and isinstance(cls.caps, Capabilities)


@pytest.mark.parametrize("kind", ["cpu", "opencl-cpu", "vulkan-cpu", "cuda"])
def test_kv_caches_follow_the_protocol(kind):
    backend = make(kind)
    assert isinstance(backend.caps, Capabilities) and backend.caps.storage == "float32"
    cache = backend.kv_cache(0, 2, 8)
    assert isinstance(cache, KVCache) and backend.kv_caches == {0: cache}
    assert (cache.kv_heads, cache.head_dim) == (2, 8) and cache.capacity >= 5 and cache.nbytes > 0
    keys, values = np.random.default_rng(3).normal(0, 1, (2, 2, 5, 8)).astype(np.float32)
    cache.write(keys, values)
    got_keys, got_values = cache.read(5)
    assert np.array_equal(got_keys, keys) and np.array_equal(got_values, values)
    cache.reset()
    assert not any(side.any() for side in cache.read(5))


@pytest.mark.parametrize("backend_type", sorted(REGISTRY))
def test_a_backend_folder_has_the_common_skeleton(backend_type):
    folder = mapped_folders.folder("mnngpu.backends", REPO / "mnngpu") / backend_type
    assert SKELETON <= {path.relative_to(folder).as_posix() for path in folder.rglob("*.py")}
    families = {path.stem for path in (folder / "ops").glob("*.py")} - {"__init__", "base"}
    assert families and families <= CORE_FAMILIES, sorted(families - CORE_FAMILIES)


@pytest.mark.parametrize("backend_type", sorted(REGISTRY))
def test_a_backend_dispatches_by_the_table_in_its_ops_package(backend_type):
    cls = backend_class_or_skip(backend_type)
    assert cls.executions is importlib.import_module(f"{cls.__module__}.ops").EXECUTIONS
