"""Continuous batching on the CUDA backend, beside what tests/test_batch_device.py checks on every
fixed-shape backend (token identity, caches, idle rows, slots): the batched decode GEMV gives each
row its lone step's values, the batched module is captured once into a CUDA graph, and a model
with recurrent layers is refused by name.

Without cupy or a CUDA device every test skips with the reason (tests.conftest.backend_or_skip).
"""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu.backends.cuda.ops.attention import CUDAAttention
from mnngpu.errors import ConfigError
from mnngpu.generation.batch import Batch
from tests.backend.harness import OneOp, close, conv_node, linear_reference, make, quantized_linear, stored
from tests.conftest import FIXTURES
from tests.test_batch_device import DEMO, NEW_TOKENS, load, prompt_ids

RECURRENT = FIXTURES / "qwen3_5_int4_b64"   # LinearAttention layers beside Attention ones
rng = np.random.default_rng(3)


@pytest.mark.parametrize("bits, ic, block", [(4, 64, 32), (4, 36, 12), (8, 64, 32), (8, 30, 10)],
                         ids=["q4-words", "q4", "q8-words", "q8"])
def test_a_batched_decode_gemv_gives_each_row_a_lone_decode_steps_values(bits, ic, block):
    """A linear layer of a batched decode module (resized inside a batched forward) runs the
    GEMV's *_tokens twin: right against the float64 reference, and each row bit for bit what the
    one-row GEMV gives it."""
    backend = make("cuda")
    weight, dense = quantized_linear(rng, 40, ic, bits, block, bias=True)
    x = stored(backend, rng.standard_normal((5, ic, 1, 1)))
    lone = OneOp(backend, conv_node(weight), [x[:1]])
    backend.batch = []
    rows = OneOp(backend, conv_node(weight), [x])
    backend.batch = None
    assert rows.execution.gemv and rows.execution.capturable
    got = rows(x)[0].reshape(5, 40)
    close(backend, got, linear_reference(x.reshape(5, ic), dense, weight.bias))
    for r in range(5):
        np.testing.assert_array_equal(got[r], lone(x[r: r + 1])[0].reshape(40))


def test_the_batched_decode_module_replays_one_graph():
    """After its first runs the batched module's launches are captured once and replayed, over the
    pools grown for the batch's slots."""
    model = load(DEMO, "cuda")
    batch = Batch(model, slots=2)
    for ids in prompt_ids(model)[:2]:
        batch.submit(ids, max_new_tokens=NEW_TOKENS, stop_ids=())
    batch.run()
    backend = model.runtime.backend()
    batched = [r for r in backend.graphs.recordings
               if any(isinstance(e, CUDAAttention) and e.batched for e in r.executions)]
    assert batched and all(r.graph is not None and r.runs >= NEW_TOKENS - 1 for r in batched)


def test_a_recurrent_model_is_refused_batching_on_cuda_by_name():
    model = load(RECURRENT, "cuda")
    with pytest.raises(ConfigError) as refused:
        Batch(model, slots=2)
    assert refused.value.field == "parallel" and "LinearAttention" in str(refused.value)
    first, second = model.sequence, model.new_sequence()
    with pytest.raises(ConfigError) as refused:
        model.decode_rows([first, second], [1, 2])
    assert refused.value.field == "parallel" and "LinearAttention" in str(refused.value)
