"""`mnngpu inspect` says, before any load, which family a folder is and which backends run each
op type of its graph: checked on the fixture exports against the backends' own op tables, and on
hand-built graphs with an op no backend runs, an unknown family and no family at all."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter

import flatbuffers
import pytest

from mnngpu.apps.cli import main
from mnngpu.apps.inspect import format_inspect_table, inspect_model
from mnngpu.backend import REGISTRY, backend_class, registry
from mnngpu.config import LlmConfig
from mnngpu.errors import BackendUnavailableError, ConfigError
from mnngpu.format.enums import OP_TYPE
from mnngpu.ops import op_table
from mnngpu.ops.routing import SPARSE_MOE
from tests.format import fb_writer as fbw
from tests.format.format_truth import FIXTURE_NAMES, fixture_dir, fixture_family, needs_fixtures, reference

TYPE_CODE = {name: code for code, name in OP_TYPE.items()}
# The package each device backend drives its device through, as pyproject.toml's extras install them.
DRIVER_PACKAGES = {"opencl": "pyopencl", "vulkan": "vulkan", "cuda": "cupy"}


def installed(backend_type: str) -> bool:
    package = DRIVER_PACKAGES.get(backend_type)
    return package is None or importlib.util.find_spec(package) is not None


def executions(backend_type: str) -> set[str] | None:
    try:
        return set(backend_class(backend_type).executions)
    except BackendUnavailableError:
        return None


@needs_fixtures
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_family_is_supported_and_every_op_type_runs_on_its_backends(name):
    info = inspect_model(fixture_dir(name))
    assert info["family"]["model_type"] == fixture_family(name) and info["family"]["supported"]
    support = info["support"]
    ref = reference(name)
    counts = Counter(ref["op_counts"]) + Counter(ref.get("subgraph_op_counts", {}))   # a MoE export's experts
    want = {op: n for op, n in sorted(counts.items()) if op not in ("Input", "Const")}
    assert {op: facts["count"] for op, facts in support["ops"].items()} == want
    assert support["all_supported"] and support["unsupported"] == []
    for op, facts in support["ops"].items():
        runs_as = op_table.OPS[op].runs_as or op   # MoE runs as the ExpertAdd nodes it is rewritten into
        assert facts["backends"] == [b for b in REGISTRY if runs_as in (executions(b) or ())], op
        assert facts["host"] == (op in ("Shape", "Rank", "Size")), op
    for backend_type, facts in support["backends"].items():
        table = executions(backend_type)
        assert facts["available"] == (table is not None and installed(backend_type))
        if facts["available"]:
            cpu = executions("cpu")
            runs = {op: op_table.OPS[op].runs_as or op for op in want}
            assert facts["cpu_fallback"] == [op for op in want if runs[op] in cpu and runs[op] not in table
                                             and not support["ops"][op]["host"]]
    assert info["unsupported_keys"] == []
    text = format_inspect_table(info)
    assert f"{info['family']['model_type']}: supported" in text and "are supported" in text
    assert "every key's value is supported" in text


def write_model(folder, model_type: str | None, **llm_config) -> None:
    """A folder whose graph feeds its input through MNN's FmhaV2 op (300), which no backend runs."""
    b = flatbuffers.Builder(0)
    ops = [fbw.op(b, "x", TYPE_CODE["Input"], 0, None, [], [0]),
           fbw.op(b, "fmha", TYPE_CODE["FmhaV2"], 0, None, [0], [1])]
    folder.mkdir()
    (folder / "llm.mnn").write_bytes(fbw.net(b, ops, ["x", "y"], ["y"]))
    (folder / "config.json").write_text(json.dumps({"llm_model": "llm.mnn", "llm_weight": "llm.mnn.weight"}))
    llm_config = {"hidden_size": 4, "layer_nums": 1, **llm_config}
    if model_type is not None:
        llm_config["model_type"] = model_type
    (folder / "llm_config.json").write_text(json.dumps(llm_config))


def test_an_op_no_backend_runs_and_an_unknown_family_are_named_not_a_crash(tmp_path, capsys):
    folder = tmp_path / "model"
    write_model(folder, "gemma9")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir())

    assert main(["inspect", "--json", str(folder)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["family"]["model_type"] == "gemma9" and not info["family"]["supported"]
    assert info["support"]["unsupported"] == ["FmhaV2"] and not info["support"]["all_supported"]
    assert info["support"]["ops"]["FmhaV2"] == {"count": 1, "host": False, "backends": []}

    assert main(["inspect", str(folder)]) == 0
    lines = capsys.readouterr().out.splitlines()
    family = [line for line in lines if line.startswith("family")]
    assert len(family) == 1 and "gemma9: NOT SUPPORTED; not a family mnngpu supports" in family[0]
    assert "qwen2" in family[0]
    assert any(line.startswith("ops") and "NOT SUPPORTED by any backend: FmhaV2 (1)" in line for line in lines)
    for backend_type in REGISTRY:
        row = next(line for line in lines if line.split()[0] == backend_type)
        assert "cannot run this graph" in row or "not installed here" in row
    assert sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir()) == before


def test_a_folder_without_model_type_gets_one_family_line(tmp_path):
    folder = tmp_path / "model"
    write_model(folder, None)
    info = inspect_model(folder)
    assert info["family"]["model_type"] is None and not info["family"]["supported"]
    assert "names no model_type" in info["family"]["note"]
    assert sum(line.startswith("family") for line in format_inspect_table(info).splitlines()) == 1


@needs_fixtures
def test_a_backend_lacking_an_op_is_shown_falling_back_to_the_cpu(monkeypatch):
    real = registry.backend_op_tables()
    narrowed = {**real, "opencl": (real["cpu"] or frozenset()) - {"LayerNorm"}, "cuda": None}
    monkeypatch.setattr(registry, "backend_op_tables", lambda: narrowed)
    info = inspect_model(fixture_dir(FIXTURE_NAMES[0]))
    backends = info["support"]["backends"]
    assert backends["opencl"]["cpu_fallback"] == ["LayerNorm"] and backends["vulkan"]["cpu_fallback"] == []
    assert not backends["cuda"]["available"]
    assert "opencl" not in info["support"]["ops"]["LayerNorm"]["backends"]
    text = format_inspect_table(info)
    assert "falls back to the CPU for LayerNorm" in text and "not installed here" in text


@needs_fixtures
@pytest.mark.parametrize(("backend_type", "package"), sorted(DRIVER_PACKAGES.items()))
def test_a_backend_whose_package_is_missing_is_unavailable_not_said_to_run_every_op(monkeypatch, backend_type,
                                                                                     package):
    """Vulkan's and CUDA's op tables load without their package (they import it when they start),
    so a table alone does not make a backend available: without cupy, cuda is unavailable."""
    monkeypatch.setitem(sys.modules, package, None)   # `import cupy` fails, as without mnngpu[cuda]
    info = inspect_model(fixture_dir(FIXTURE_NAMES[0]))
    facts = info["support"]["backends"][backend_type]
    assert not facts["available"] and facts["missing"] == package and facts["cpu_fallback"] == []
    assert all(other["available"] == installed(name)
               for name, other in info["support"]["backends"].items() if name != backend_type)
    row = next(line for line in format_inspect_table(info).splitlines() if line.split()[0] == backend_type)
    assert row.split(None, 1)[1] == (f"unavailable: {package} is not installed here "
                                     f"(pip install 'mnngpu[{backend_type}]')")


@needs_fixtures
def test_the_moe_line_says_which_backends_run_only_the_chosen_experts():
    """The CPU, OpenCL and Vulkan run a MoE layer's chosen experts alone (their op tables have
    SPARSE_MOE); CUDA's has no routing kernels, so every expert runs there."""
    info = inspect_model(fixture_dir("qwen3_moe_int4_b64"))
    tables = {name: table for name, table in registry.backend_op_tables().items() if table is not None}
    sparse = [name for name, table in tables.items() if SPARSE_MOE in table]
    assert info["moe"]["sparse_backends"] == sparse and {"cpu", "vulkan"} <= set(sparse)
    assert info["moe"]["dense_backends"] == [name for name in tables if name not in sparse] == ["cuda"]
    line = next(line for line in format_inspect_table(info).splitlines() if line.startswith("experts"))
    chosen, _, whole = line.partition(" (only the chosen experts), ")
    names = {"cpu": "the CPU", "opencl": "OpenCL", "vulkan": "Vulkan"}
    assert all(names[name] in chosen for name in sparse) and "CUDA" not in chosen
    assert whole == "the whole file on CUDA (every expert runs)"


def test_a_config_value_load_rejects_is_listed_by_inspect_not_raised(tmp_path, capsys):
    folder = tmp_path / "model"
    write_model(folder, "chatglm", attention_mask="glm")
    with pytest.raises(ConfigError, match="attention_mask"):
        LlmConfig.load(folder)
    assert main(["inspect", "--json", str(folder)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [key["key"] for key in info["unsupported_keys"]] == ["attention_mask"]
    assert info["unsupported_keys"][0]["path"] == str(folder / "llm_config.json")
    assert not info["family"]["supported"] and "not a family mnngpu supports" in info["family"]["note"]
    assert main(["inspect", str(folder)]) == 0
    lines = capsys.readouterr().out.splitlines()
    config_rows = [line for line in lines if line.startswith("config")]
    assert len(config_rows) == 1 and 'attention_mask: "glm" is not supported' in config_rows[0]


def test_llama4_text_is_supported_with_one_line_on_what_its_export_dropped(tmp_path):
    """llmexport writes Llama 4 text with every layer full attention with rotary (attention_type
    full): the family runs as MNN runs it, and inspect says which parts of the model are not in it."""
    folder = tmp_path / "model"
    write_model(folder, "llama4_text", attention_type="full")
    info = inspect_model(folder)
    assert info["family"]["supported"] and info["family"]["model_type"] == "llama4_text"
    rows = [line for line in format_inspect_table(info).splitlines() if line.startswith("family")]
    assert len(rows) == 1 and "llama4_text: supported" in rows[0]
    for dropped in ("chunked attention", "attention temperature", "no-rope layers"):
        assert dropped in rows[0]
