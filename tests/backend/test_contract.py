"""The backend contract: every registered backend offers exactly the methods mnngpu.backend.Backend
declares (what its own executions call on it is private, a leading underscore), declares one
Capabilities record, and keeps KV caches that follow backend.kv.KVCache. Every backend folder has
the same skeleton, its op table in ops/__init__.py and its Executions in files named after the
core op families (mnngpu/ops/)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from mnngpu import mapped_folders
from mnngpu.backend import REGISTRY, Backend, BackendConfig, Capabilities, Execution, Node, backend_class
from mnngpu.backend.kv import KVCache
from mnngpu.errors import BackendUnavailableError
from tests.backend.harness import make

MAX_METHODS = 10
REPO = Path(__file__).resolve().parents[2]
SKELETON = {"__init__.py", "device.py", "memory.py", "ops/__init__.py", "ops/base.py"}
CORE_FAMILIES = ({path.stem for path in (REPO / "mnngpu" / "ops").glob("*.py")}
                 - {"__init__", "common", "op_table"})


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


# ---- one home for each concept: read from the sources, so CUDA is checked without cupy --------------

PREFIX = {"cpu": "CPU", "opencl": "OpenCL", "vulkan": "Vulkan", "cuda": "CUDA"}   # its Executions' names
EXECUTION_ROOTS = {"Execution", "PlannedExecution"}   # mnngpu.backend's bases


def _classes(path: Path) -> dict[str, list[str]]:
    """Each class defined in `path`, with the names of its bases."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name: [ast.unparse(base).rpartition(".")[2] for base in node.bases]
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def _backend_folder(backend_type: str) -> Path:
    return mapped_folders.folder("mnngpu.backends", REPO / "mnngpu") / backend_type


def _execution_classes(backend_type: str) -> set[str]:
    """The classes of a backend's ops/ that derive from an Execution, by their bases' names."""
    bases: dict[str, list[str]] = {}
    for path in sorted((_backend_folder(backend_type) / "ops").glob("*.py")):
        bases.update(_classes(path))
    executions = set(EXECUTION_ROOTS)
    while grown := {name for name, parents in bases.items() if set(parents) & executions} - executions:
        executions |= grown
    return executions - EXECUTION_ROOTS


@pytest.mark.parametrize("backend_type", sorted(REGISTRY))
def test_executions_are_named_after_their_backend_and_op(backend_type):
    names = _execution_classes(backend_type)
    assert len(names) >= 5, names   # the base class and at least the linear, norm, attention and view ops
    assert sorted(n for n in names if not n.startswith(PREFIX[backend_type])) == []


@pytest.mark.parametrize("backend_type", sorted(REGISTRY))
def test_a_backend_leaves_weight_packing_and_variants_to_its_executions(backend_type):
    """Packing lives in each Execution's `pack`, and a variant the op type cannot key in its
    `variant_for`: the Backend class keeps no type switch in rearrange or onCreate."""
    backend = _classes(_backend_folder(backend_type) / "__init__.py")
    tree = ast.parse((_backend_folder(backend_type) / "__init__.py").read_text(encoding="utf-8"))
    methods = {f.name for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef) and "Backend" in backend[node.name]
               for f in node.body if isinstance(f, ast.FunctionDef)}
    assert methods and not methods & {"rearrange", "onCreate"}


def test_the_default_rearrange_asks_the_tables_execution_to_pack():
    packed = []

    class Packing(Execution):
        @classmethod
        def pack(cls, backend, node):
            packed.append((backend, node.name))

        def onExecute(self, inputs, outputs):  # noqa: N802
            pass

    class TableOnly(Backend):
        executions = {"Convolution": Packing}
        alloc = upload = download = kv_cache = lambda *args: None

    backend = TableOnly(BackendConfig())
    backend.rearrange(Node("Convolution", "fc"))
    backend.rearrange(Node("LayerNorm", "norm"))   # not in the table: nothing to pack
    assert packed == [(backend, "fc")]


REFUSAL_WORDS = re.compile(r"refus|lacking|problem", re.IGNORECASE)


def test_the_engine_and_the_backends_say_decline_for_an_op_they_do_not_take():
    """One word for it, in definitions and attributes: decline (declines, declined)."""
    roots = [REPO / "mnngpu" / name for name in ("backend", "ops", "runtime")]
    roots.append(mapped_folders.folder("mnngpu.backends", REPO / "mnngpu"))
    found = set()
    for path in (p for root in roots for p in root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = (getattr(node, "name", None) if isinstance(node, ast.FunctionDef | ast.ClassDef)
                    else node.attr if isinstance(node, ast.Attribute) else None)
            if name and REFUSAL_WORDS.search(name) and name != "conv_weight_problem":
                found.add(f"{path.relative_to(REPO)}: {name}")
    assert sorted(found) == []


@pytest.mark.parametrize("backend_type", sorted(REGISTRY))
def test_each_family_file_holds_the_rows_of_its_core_family(backend_type):
    """A backend's ops/<family>.py lists only op types of mnngpu/ops/<family>.py, so adding an op
    touches one file per backend (ops/base.py may take any op by its host rule)."""
    cls = backend_class_or_skip(backend_type)
    table = importlib.import_module(f"{cls.__module__}.ops")
    merged = {}
    for family in table.FAMILIES:
        name = family.__name__.rpartition(".")[2]
        if name != "base":
            core = importlib.import_module(f"mnngpu.ops.{name}").ROWS
            assert set(family.EXECUTIONS) <= set(core), (name, sorted(set(family.EXECUTIONS) - set(core)))
        merged.update(family.EXECUTIONS)
    assert merged == cls.executions
