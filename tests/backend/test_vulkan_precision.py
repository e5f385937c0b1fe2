"""precision low on Vulkan: the KV cache (and any unquantized weight) in fp16 storage, and still
every fixture's first-step logits within 2e-2 x std of what MNN recorded at precision high."""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from tests.conftest import FIXTURES, MODEL_NAMES, backend_or_skip, reference, skip_unavailable

LOW_TOLERANCE = 2e-2


@pytest.fixture(scope="module")
def fp16_device():
    backend = backend_or_skip("vulkan")
    if not backend.device.fp16:
        skip_unavailable("vulkan", f"{backend.device.name} lacks shaderFloat16 or 16-bit storage buffers")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_low_precision_logits_stay_close_to_mnn(fp16_device, name):
    ref, first_logits = reference(name)
    model = mnngpu_llm.create(FIXTURES / name)
    model.set_config({"backend_type": "vulkan", "precision": "low", "thread_num": 2})
    model.load()
    assert model.runtime.backend().caps.storage == "float16"
    for k, prompt in enumerate(ref["prompts"]):
        model.reset()
        logits = np.asarray(model.forward(prompt["ids"]))[0, -1]
        scale = float(first_logits[k].std())
        assert np.abs(logits - first_logits[k]).max() <= LOW_TOLERANCE * scale, prompt["text"]


@pytest.mark.parametrize("seed", [11, 23, 37, 41])
def test_low_precision_on_random_exports(fp16_device, seed, tmp_path_factory):
    """The models the conformance suite exports from random shapes and quant settings (shared
    with it: each is exported once per session), at precision low."""
    from tests.conformance.test_random_exports import exported

    model_dir, ref, first_logits = exported(seed, str(tmp_path_factory.getbasetemp() / "random_exports"))
    model = mnngpu_llm.create(model_dir)
    model.set_config({"backend_type": "vulkan", "precision": "low", "thread_num": 2})
    model.load()
    for k, prompt in enumerate(ref["prompts"]):
        model.reset()
        logits = np.asarray(model.forward(prompt["ids"]))[0, -1]
        assert np.abs(logits - first_logits[k]).max() <= LOW_TOLERANCE * first_logits[k].std(), seed
