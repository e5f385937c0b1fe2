"""The package's shape, read from the source files: the engine apart from the applications and the
backends, no import circles, a short top level, and tools and benchmarks that run as modules.

The import graph is built with `ast` from every `import` statement: those inside functions (an
import deferred to call time is still an arrow between two modules) and those under
`if TYPE_CHECKING:` (a circle of type-only imports is still a circle for the reader) included.
"""

from __future__ import annotations

import ast
import graphlib
import tomllib
from pathlib import Path

import pytest

from mnngpu import mapped_folders

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "mnngpu"
MAX_TOP_LEVEL_MODULES = 12
# Folders of the checkout that setuptools installs as subpackages of mnngpu (pyproject's package-dir).
MAPPED_PACKAGES = {name: mapped_folders.folder(name, PACKAGE) for name in mapped_folders.MAPPED}
# What the engine (everything in mnngpu/ outside apps/) must never import.
ENGINE_MUST_NOT_IMPORT = ("mnngpu.apps", "mnngpu.backends")
# `python -m mnngpu` is the command line: it starts the CLI application.
ENTRY_POINT = "mnngpu.__main__"
# All that a backend folder may import beyond its own folder: the contract, the op families, the
# errors, the kernel cache and the shipped kernel sources.
BACKEND_MAY_IMPORT = ("mnngpu.backend", "mnngpu.ops", "mnngpu.errors", "mnngpu.jit", "mnngpu.shaders")


def module_files() -> dict[str, Path]:
    """Every module of mnngpu, by dotted name (a package by its own name, for its __init__.py)."""
    roots = {"mnngpu": PACKAGE, **MAPPED_PACKAGES}
    modules = {}
    for root_name, root in roots.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((root_name, *parts))] = path
    return modules


MODULES = module_files()


def _imports(tree: ast.AST):
    """Every Import and ImportFrom node of `tree`, at any depth."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def _known(name: str) -> str | None:
    """`name`, or the closest enclosing module of mnngpu that exists; None outside mnngpu."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + is_package]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(module: str) -> set[str]:
    """The modules of mnngpu that `module` imports (`from pkg import name` names pkg.name when it
    is a module, else pkg)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found = set()
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            source = _absolute(module, node)
            names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                     for alias in node.names]
        found.update(filter(None, map(_known, names)))
    found.discard(module)
    return found


GRAPH = {module: imported_modules(module) for module in MODULES}


def first_cycle(graph: dict[str, set[str]]) -> list[str]:
    """A circle of imports in `graph` (the modules in order, the first again at the end), or []."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return error.args[1]
    return []


def _within(module: str, packages) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def test_the_import_graph_sees_the_engine_its_backends_and_type_only_imports():
    assert "mnngpu.runtime.schedule" in GRAPH["mnngpu.engine.loading"]
    assert "mnngpu.backend" in GRAPH["mnngpu.backends.cpu"]
    assert "mnngpu.shaders" in GRAPH["mnngpu.backends.vulkan.device"]
    assert "mnngpu.backend" in GRAPH["mnngpu.ops.common"]   # under `if TYPE_CHECKING:` there


def test_a_backend_imports_only_the_contract_and_its_own_folder():
    backends = [m for m in GRAPH if m.startswith("mnngpu.backends.")]
    offenders = {}
    for module in backends:
        own = ".".join(module.split(".")[:3])   # mnngpu.backends.<name>
        outside = sorted(i for i in GRAPH[module] if not _within(i, (own, *BACKEND_MAY_IMPORT)))
        if outside:
            offenders[module] = outside
    assert backends and offenders == {}


def test_the_mapped_folders_are_those_pyproject_installs():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["package-dir"] == mapped_folders.MAPPED
    assert all(path.is_dir() and path.parent == REPO for path in MAPPED_PACKAGES.values())
    # ruff cannot follow package-dir: it is told that everything under mnngpu is first-party
    assert pyproject["tool"]["ruff"]["lint"]["isort"]["known-first-party"] == ["mnngpu"]


def test_no_module_imports_one_that_imports_it_back():
    pairs = sorted((a, b) for a, imports in GRAPH.items() for b in imports if a < b and a in GRAPH[b])
    assert pairs == []


def test_the_imports_of_mnngpu_have_no_circle():
    assert first_cycle(GRAPH) == []


LOAD_CHAIN = ("mnngpu.runtime.module", "mnngpu.runtime.pipeline_module", "mnngpu.runtime.static_module",
              "mnngpu.runtime.session", "mnngpu.runtime.pipeline", "mnngpu.backend")


def test_mnns_load_chain_reads_top_down():
    """Module -> PipelineModule -> StaticModule -> Session -> Pipeline -> Execution: each layer
    imports the next, and none imports a layer above it."""
    for upper, lower in zip(LOAD_CHAIN, LOAD_CHAIN[1:]):
        assert lower in GRAPH[upper], (upper, lower)
    for position, layer in enumerate(LOAD_CHAIN):
        assert not GRAPH[layer] & set(LOAD_CHAIN[:position]), layer


def test_a_circle_is_found():
    cycle = first_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert cycle[0] == cycle[-1] and sorted(cycle[1:]) == ["a", "b", "c"]
    assert first_cycle({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) == []


@pytest.mark.parametrize("forbidden", ENGINE_MUST_NOT_IMPORT)
def test_the_engine_imports_no_application_and_no_backend(forbidden):
    engine = [m for m in GRAPH if m.split(".")[0] == "mnngpu" and m != ENTRY_POINT
              and not m.startswith(ENGINE_MUST_NOT_IMPORT)]
    offenders = {m: sorted(i for i in GRAPH[m] if i == forbidden or i.startswith(forbidden + "."))
                 for m in engine}
    assert {m: i for m, i in offenders.items() if i} == {}


def test_mnngpu_has_a_short_top_level():
    top_level = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top_level) <= MAX_TOP_LEVEL_MODULES, top_level


@pytest.mark.parametrize("folder", ["tools", "benchmarks"])
def test_tools_and_benchmarks_run_as_modules_without_editing_sys_path(folder):
    offenders = [str(path.relative_to(REPO)) for path in sorted((REPO / folder).rglob("*"))
                 if path.is_file() and path.suffix in (".py", ".sh") and "sys.path" in path.read_text()]
    assert offenders == []
    assert (REPO / folder / "__init__.py").is_file()
