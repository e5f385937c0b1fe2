"""The recurrent fixtures (lfm2, qwen3_5, qwen3_5_moe) with LinearAttention on the device backends:
the placement table shows every LinearAttention op on opencl or vulkan (none fell back to the CPU),
its state is a device StateCache, and the greedy tokens and first-step logits are MNN's recorded
ones (precision high, 1e-3 x the logits' std)."""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu.backend.kv import StateCache
from tests.conformance.test_fixture_models import LOGIT_TOLERANCE, greedy, load
from tests.conftest import backend_or_skip, reference

MODELS = ("lfm2_int4_b64", "qwen3_5_int4_b64", "qwen3_5_moe_int4_b64")
DEVICES = ("opencl", "vulkan")


def assert_linear_attention_on(model, backend_type: str) -> None:
    placed = [p for p in model.runtime.placements.entries.values() if p.op_type == "LinearAttention"]
    assert placed, "the fixture has LinearAttention ops"
    for placement in placed:
        assert (placement.backend, placement.reason) == (backend_type, ""), placement
    backend = model.runtime.backend()
    states = [backend.state_caches[p.node] for p in placed]
    assert all(isinstance(s, StateCache) and type(s).__module__.startswith(f"mnngpu.backends.{backend_type}")
               for s in states)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("device", DEVICES)
def test_recurrent_layers_run_on_the_device_and_give_mnn_tokens(device, name):
    backend_or_skip(device)
    ref, first_logits = reference(name)
    model = load(name, device)
    for k, prompt in enumerate(ref["prompts"]):
        tokens, first = greedy(model, prompt["ids"], len(prompt["greedy"]))
        scale = float(first_logits[k].std())
        assert np.abs(first - first_logits[k]).max() <= LOGIT_TOLERANCE * scale, prompt["text"]
        assert tokens == prompt["greedy"], prompt["text"]
    assert_linear_attention_on(model, device)
