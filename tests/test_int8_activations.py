"""int8_activations: the CPU's int4 layers at precision low quantize their activations to int8.

The kernels' arithmetic is checked against separate numpy math in test_jit.py (XQ_LEVELS). Here:
the key reaches a model's layers, a batched decode row is still its lone step bit for bit, the
logits stay where int8 rounding puts them, and the key is refused where it would do nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from mnngpu.errors import ConfigError
from tests.conftest import FIXTURES, reference

NAME = "qwen2_int4_b64"   # int4, block 64: every linear layer in lane groups
# int8 rounding of each layer's input (about 3% of the std a layer) after 4 layers, on this fixture's
# first prompts: 0.34 of the std at most (int16: 0.007); a wrong dot or step is far outside it.
INT8_TOLERANCE = 0.6


def load(int8: bool, folder=FIXTURES / NAME):
    model = mnngpu_llm.create(folder)
    model.set_config({"backend_type": "cpu", "precision": "low", "thread_num": 2, "int8_activations": int8})
    model.load()
    return model


def first_logits(model, ids) -> np.ndarray:
    model.reset()
    return np.asarray(model.forward(ids), dtype=np.float32)[0, -1]


def test_the_key_changes_the_layers_and_stays_near_mnn():
    ref, recorded = reference(NAME)
    int16, int8 = load(False), load(True)
    for k, prompt in enumerate(ref["prompts"][:3]):
        low, quantized = first_logits(int16, prompt["ids"]), first_logits(int8, prompt["ids"])
        std = recorded[k].std()
        assert np.abs(quantized - low).max() > 1e-3 * std, "int8_activations computed what int16 computes"
        assert np.abs(quantized - recorded[k]).max() <= INT8_TOLERANCE * std, prompt["text"]


def test_a_batched_decode_row_is_its_lone_step_bit_for_bit():
    ref, _ = reference(NAME)
    model = load(True)
    prompts = [prompt["ids"] for prompt in ref["prompts"][:3]]
    sequences, lone = [], []
    for ids in prompts:
        sequence = model.new_sequence()
        model.use_sequence(sequence)
        model.forward(ids)
        sequences.append(sequence)
    for sequence, ids in zip(sequences, prompts):   # each one's next step, alone, on a copy of its state
        alone = model.new_sequence()
        model.use_sequence(alone)
        model.forward(ids)
        lone.append(np.asarray(model.forward([7]), dtype=np.float32)[0, -1])
    batched = model.decode_rows(sequences, [7, 7, 7])
    for row, want in zip(batched, lone):
        assert np.array_equal(row, want)


@pytest.mark.parametrize("name, settings, named", [
    (NAME, {"precision": "high"}, "precision high"),
    (NAME, {"backend_type": "vulkan"}, "vulkan"),
    ("qwen3_fp16", {}, "no int4 layer"),           # fp16 weights: no lane groups
    ("phi3_int4_b32", {}, "no int4 layer"),        # int4 in blocks of 32: not lane groups either
])
def test_refused_where_no_kernel_quantizes_to_int8(name, settings, named):
    model = mnngpu_llm.create(FIXTURES / name)
    model.set_config({"int8_activations": True, "precision": "low", **settings})
    with pytest.raises(ConfigError, match="int8_activations") as error:
        model.load()
    assert named in str(error.value)
