"""Placement: an op a device backend declines runs on the CPU backup, matches, and is said out loud
(the placement table, `inspect --backend`, the ready line); strict_device refuses it."""

from __future__ import annotations

import json
import re
from functools import partial

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from mnngpu.apps.cli import main
from mnngpu.backend import BackendConfig, Node, Tensor
from mnngpu.errors import BackendUnavailableError
from mnngpu.format import params as P
from mnngpu.format.quant import QuantizedLinear
from mnngpu.progress import ready_line
from mnngpu.runtime.graph import GraphOp
from mnngpu.runtime.pipeline import Pipeline
from mnngpu.runtime.placement import PlacementTable, decline
from tests import reference
from tests.conftest import FIXTURES, backend_or_skip
from tests.conftest import reference as fixture_reference

MODEL = "qwen2_int4_b64"


# ---- a width the Vulkan kernels do not take ---------------------------------------------------

def narrow_linear(rng, oc: int, ic: int) -> tuple[QuantizedLinear, np.ndarray]:
    levels, scales, zeros = reference.random_levels(rng, oc, ic, 8, ic)
    weight = QuantizedLinear(oc, ic, 8, ic, False, levels, scales, zeros, None)
    return weight, levels.astype(np.float64) * scales + zeros


def loaded_node(backend, weight: QuantizedLinear) -> Node:
    """A Convolution as static_module makes one: raw weights re-readable, packed by the main backend."""
    common = P.Convolution2DCommon(inputCount=weight.ic, outputCount=weight.oc)
    node = Node("Convolution", "fc12", P.Convolution2D(common=common), {"weight": weight},
                source=partial(lambda w: {"weight": w}, weight))
    backend.rearrange(node)
    node.packed_for.add(backend.type)
    return node


def resize_one(backend, node, x: np.ndarray, strict: bool = False):
    from mnngpu.backends.cpu import CPUBackend

    backend.config.strict_device = strict
    table = PlacementTable(backend.type)
    cpu = CPUBackend(BackendConfig(precision="high", thread_num=1), backend.kv_meta)
    pipeline = Pipeline([GraphOp(node, [0], [1])], backend, cpu, table)
    tensors = [Tensor(x.shape, x.dtype, "x"), None]
    pipeline.bind_input(tensors[0])
    pipeline.resize(tensors)
    return pipeline, tensors, table


def test_vulkan_declines_a_width_not_a_multiple_of_8_and_the_cpu_runs_it():
    backend = backend_or_skip("vulkan")
    rng = np.random.default_rng(12)
    weight, dense = narrow_linear(rng, oc=16, ic=12)
    node = loaded_node(backend, weight)
    x = rng.normal(0, 1, (3, 12, 1, 1)).astype(np.float32)
    pipeline, tensors, table = resize_one(backend, node, x)
    backend.upload(tensors[0], x)
    pipeline.run()
    holder = pipeline.backend_of(tensors[1])
    assert holder.type == "cpu"
    reference.assert_close(holder.download(tensors[1]).reshape(3, 16), x.reshape(3, 12).astype(np.float64) @ dense.T,
                           1e-5)
    (fallback,) = table.fallbacks
    assert fallback.node == "fc12" and "input width 12 is not a multiple of 8" in fallback.reason
    assert decline(backend, tensors[:1], tensors[1:], node) is not None
    assert decline(holder, tensors[:1], tensors[1:], node) is None


def test_strict_device_refuses_the_fallback():
    backend = backend_or_skip("vulkan")
    weight, _ = narrow_linear(np.random.default_rng(1), oc=8, ic=12)
    x = np.zeros((1, 12, 1, 1), dtype=np.float32)
    with pytest.raises(BackendUnavailableError, match=r"strict_device.*fc12.*multiple of 8"):
        resize_one(backend, loaded_node(backend, weight), x, strict=True)


# ---- an op removed from a backend's table, on a fixture model ---------------------------------

@pytest.fixture(params=["vulkan", "opencl"])
def without_convolution(request, monkeypatch):
    """The backend's op table without Convolution (the fused linear forms stay)."""
    backend = backend_or_skip(request.param)
    table = {op: cls for op, cls in type(backend).executions.items() if op != "Convolution"}
    monkeypatch.setattr(type(backend), "executions", table)
    return request.param


@pytest.fixture
def vulkan_wider_groups(monkeypatch):
    """Vulkan's linear kernels as if they read inputs in groups of 256: no layer of the fixture
    (widths 128 and 192) is packable, so each is declined for its width, at load as on a device
    whose kernels cannot take it."""
    backend_or_skip("vulkan")
    from mnngpu.backends.vulkan.ops import linear

    monkeypatch.setattr(linear, "GROUP", 256)
    return "vulkan"


def test_widths_the_kernels_cannot_take_fall_back_match_and_are_reported(vulkan_wider_groups, capsys):
    model = load("vulkan")
    fallbacks = model.placement().fallbacks
    assert fallbacks and all(re.fullmatch(r"input width \d+ is not a multiple of 256", p.reason) for p in fallbacks)
    ref, first_logits = fixture_reference(MODEL)
    logits = np.asarray(model.forward(ref["prompts"][0]["ids"]))[0, -1]
    assert np.abs(logits - first_logits[0]).max() <= 1e-3 * first_logits[0].std()
    assert f", {len(fallbacks)} ops fell back to the CPU" in ready_line(model, 0.1)
    assert main(["inspect", str(FIXTURES / MODEL), "--backend", "vulkan"]) == 0
    assert "(declined: input width 128 is not a multiple of 256)" in capsys.readouterr().out
    with pytest.raises(BackendUnavailableError, match="strict_device=true: .* input width"):
        load("vulkan", strict_device=True)


def load(backend_type: str, **overrides):
    model = mnngpu_llm.create(FIXTURES / MODEL)
    model.set_config({"backend_type": backend_type, "precision": "high", "thread_num": 2, **overrides})
    model.load()
    return model


def test_removed_op_falls_back_matches_and_is_reported(without_convolution):
    model = load(without_convolution)
    fallbacks = model.placement().fallbacks
    assert fallbacks and {p.op_type for p in fallbacks} == {"Convolution"}
    assert all(p.reason == f"Convolution is not in the {without_convolution} op table" for p in fallbacks)
    ref, first_logits = fixture_reference(MODEL)
    prompt = ref["prompts"][0]
    logits = np.asarray(model.forward(prompt["ids"]))[0, -1]
    assert np.abs(logits - first_logits[0]).max() <= 1e-3 * first_logits[0].std()
    line = ready_line(model, 0.1)
    assert f"on {without_convolution} on " in line and f", {len(fallbacks)} ops fell back to the CPU" in line


def test_inspect_backend_prints_the_fallbacks(without_convolution, capsys):
    assert main(["inspect", str(FIXTURES / MODEL), "--backend", without_convolution]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^device: {without_convolution} on .+ \((CPU|GPU)\)$", out, re.MULTILINE)
    assert re.search(r"placement on \w+: .*; [1-9]\d* fell back to the CPU", out)
    assert re.search(rf"lm_head\S*\s+Convolution\s+cpu\s+\(declined: Convolution is not in the "
                     rf"{without_convolution} op table\)", out)


def test_strict_device_refuses_the_removed_op_at_load(without_convolution):
    with pytest.raises(BackendUnavailableError, match="strict_device=true: op .* \\(Convolution\\) would fall back"):
        load(without_convolution, strict_device=True)


def test_no_fallback_on_the_full_tables(capsys):
    model = load("cpu")
    assert not model.placement().fallbacks
    assert "fell back" not in ready_line(model, 0.1)
    assert main(["inspect", str(FIXTURES / MODEL), "--backend", "cpu", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["device"] == "cpu" and {row["backend"] for row in info["placement"]} == {"cpu", "host"}
    assert sum(row["op_type"] == "Attention" for row in info["placement"]) == 2


def test_vulkan_says_when_it_runs_on_a_cpu_device_or_without_fp16(monkeypatch, recwarn):
    from mnngpu.backend import DeviceWarning
    from mnngpu.backend import interface as backend_module

    device = backend_or_skip("vulkan").device
    backend_module._warned.clear()
    monkeypatch.setattr(device, "fp16", False)
    monkeypatch.setattr(device, "is_cpu", True)
    from mnngpu.backends.vulkan import VulkanBackend

    for _ in range(2):
        VulkanBackend(BackendConfig(precision="low"))
    lines = [str(w.message) for w in recwarn if w.category is DeviceWarning]
    assert len(lines) == 2   # one line each, not one per backend
    assert "a CPU device" in lines[0] and "precision 'low' runs in fp32" in lines[1]


# ---- a host value read on both sides ----------------------------------------------------------

@pytest.mark.parametrize("backend_type", ["opencl", "vulkan"])
def test_indices_a_cpu_backup_op_read_first_still_plan_the_device_gather(backend_type, monkeypatch):
    """A constant that an op on the CPU backup reads first, then a device Gather as its indices:
    the device gets its own upload with the host value kept (the gather is planned from it)."""
    from mnngpu.backends.cpu import CPUBackend

    backend = backend_or_skip(backend_type)
    table = {op: cls for op, cls in type(backend).executions.items() if op != "BinaryOp"}
    monkeypatch.setattr(type(backend), "executions", table)
    cpu = CPUBackend(BackendConfig(precision="high", thread_num=1), backend.kv_meta)
    shift = Node("BinaryOp", "shifted", P.BinaryOp(opType="ADD", T="DT_INT32"))
    pick = Node("GatherV2", "picked", P.GatherV2())
    rows = np.arange(20, dtype=np.float32).reshape(4, 5)
    counts = np.array([10, 20, 30], dtype=np.int32)
    indices = np.array([2, 0, 3], dtype=np.int32)
    tensors = [Tensor(rows.shape, rows.dtype, "rows"), Tensor(counts.shape, counts.dtype, "counts"),
               Tensor(indices.shape, indices.dtype, "indices", host=indices), None, None]
    table = PlacementTable(backend.type)
    pipeline = Pipeline([GraphOp(shift, [1, 2], [3]), GraphOp(pick, [0, 2], [4])], backend, cpu, table)
    for graph_input in tensors[:2]:
        pipeline.bind_input(graph_input)
    pipeline.resize(tensors)
    backend.upload(tensors[0], rows)
    backend.upload(tensors[1], counts)
    pipeline.run()
    assert [p.backend for p in table.entries.values()] == ["cpu", backend_type]
    np.testing.assert_array_equal(pipeline.backend_of(tensors[3]).download(tensors[3]), counts + indices)
    np.testing.assert_array_equal(backend.download(tensors[4]), rows[indices])
