"""`mnngpu diff`: two backends on a fixture model's graph agree op by op, and a deliberately broken
kernel is found at its own op."""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu.apps.cli import main
from mnngpu.apps.diff import DEFAULT_TOLERANCE, diff_backends, first_divergence
from mnngpu.format import read_net
from tests.conftest import FIXTURES, backend_or_skip

MODEL = FIXTURES / "qwen2_int4_b64"
IDS = [3, 17, 42, 99, 7, 250]


def layer_norm_names() -> list[str]:
    return [op.name for op in read_net(MODEL / "llm.mnn").ops if op.type == "LayerNorm"]


@pytest.fixture
def broken_vulkan_norm(monkeypatch):
    """Vulkan's LayerNorm with gamma x 1.5, for one node only: the third LayerNorm of the graph."""
    backend_or_skip("vulkan")
    from mnngpu.backends.vulkan.ops.norm import VulkanLayerNorm

    target = layer_norm_names()[2]
    original = VulkanLayerNorm.onResize

    def broken(self, inputs, outputs):
        if self.node.name == target:
            gamma = np.asarray(self.node.weights["gamma"], dtype=np.float32) * 1.5
            _, beta = self.node.weights["vulkan_norm"]
            self.node.weights["vulkan_norm"] = (self.backend._constant(gamma), beta)
        original(self, inputs, outputs)

    monkeypatch.setattr(VulkanLayerNorm, "onResize", broken)
    return target


def test_cpu_and_vulkan_agree_on_every_op():
    backend_or_skip("vulkan")
    ids, diffs = diff_backends(MODEL, ["cpu", "vulkan"], ids=IDS)
    assert ids == IDS
    ops = {d.op_type for d in diffs}
    assert {"Attention", "LayerNorm", "Convolution", "BinaryOp"} <= ops
    assert diffs[-1].tensor == "logits"
    assert first_divergence(diffs, DEFAULT_TOLERANCE) is None, max(d.error for d in diffs)


def test_a_broken_kernel_is_named_at_its_op(broken_vulkan_norm):
    _, diffs = diff_backends(MODEL, ["cpu", "vulkan"], ids=IDS)
    first = first_divergence(diffs, DEFAULT_TOLERANCE)
    assert first is not None and first.node == broken_vulkan_norm and first.op_type == "LayerNorm"
    assert first.error > 0.1
    before = diffs[:diffs.index(first)]
    assert before and all(d.error <= DEFAULT_TOLERANCE for d in before)


def test_diff_command_prints_each_op_and_the_first_over_tolerance(broken_vulkan_norm, capsys):
    assert main(["diff", str(MODEL), "--backends", "cpu,vulkan", "--prompt", "hello there"]) == 1
    out = capsys.readouterr().out
    assert f"first op over 0.001: {broken_vulkan_norm} (LayerNorm)" in out
    assert out.count("error ") >= 20   # one line per compared op output


def test_diff_wants_two_backends(capsys):
    assert main(["diff", str(MODEL), "--backends", "cpu"]) == 2
    assert "expected two backends" in capsys.readouterr().err
