"""LinearAttention (mnngpu/ops/linear_attention.py) and the recurrent state it keeps (mnngpu/backend/kv.py's
StateCache), on the CPU backend and on the lfm2 and qwen3_5 fixtures.

Truths: per-token numpy loops written apart from the CPU kernels (here for the short convolution,
tests/reference.py's gated_delta_net for the delta rule); a fresh load of the model (what reset()
must give back: MNN 3.6.1's own reset keeps the state, so its second prompt would differ); the
unchunked prefill.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mnngpu import llm as mnngpu_llm
from mnngpu.backend import BackendConfig, Node
from mnngpu.backend.kv import HostStateCache, KVMeta, StateCache, StateRollbackError, state_step
from mnngpu.backend.sequences import cache_nbytes
from mnngpu.backends.cpu import CPUBackend
from mnngpu.backends.cpu.kernels import linear_attention as kernels
from mnngpu.backends.cpu.ops.linear_attention import CHUNK, gated_delta_rule, short_conv
from mnngpu.errors import ModelFormatError
from mnngpu.format.params import LinearAttentionParam
from mnngpu.ops import linear_attention
from tests import reference as numpy_reference
from tests.backend.harness import OneOp
from tests.conftest import FIXTURES, reference

MODEL = "lfm2_int4_b64"
MODELS = ("lfm2_int4_b64", "qwen3_5_int4_b64")
CHANNELS, KERNEL = 6, 3


def short_conv_by_token(qkv: np.ndarray, weight: np.ndarray, history: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One token at a time: y_t = c_t * sum_k w_k * (b*x)_{t-K+1+k}, the window reaching into `history`."""
    channels, kernel = weight.shape
    b, c, x = qkv[:channels], qkv[channels: 2 * channels], qkv[2 * channels:]
    window = [history[:, i].astype(np.float64) for i in range(kernel - 1)]
    out = []
    for t in range(qkv.shape[1]):
        window.append(b[:, t].astype(np.float64) * x[:, t])
        out.append(c[:, t] * sum(weight[:, k] * window[-kernel + k] for k in range(kernel)))
    return np.array(out), np.stack(window[-(kernel - 1):], axis=1)


def test_short_conv_matches_a_per_token_loop_across_chunks():
    rng = np.random.default_rng(5)
    qkv = rng.normal(size=(3 * CHANNELS, 11)).astype(np.float32)
    weight = rng.normal(size=(CHANNELS, KERNEL)).astype(np.float32)
    want, want_state = short_conv_by_token(qkv, weight, np.zeros((CHANNELS, KERNEL - 1)))
    state = np.zeros((CHANNELS, KERNEL - 1), np.float32)
    got = []
    for start, stop in ((0, 4), (4, 5), (5, 11)):   # a prefill in pieces, then a decode step, then more
        piece = np.ascontiguousarray(qkv[:, start:stop])
        out = np.empty((stop - start, CHANNELS), np.float32)
        short_conv(piece, weight, state, stop - start, out, np.empty((CHANNELS, KERNEL - 1 + stop - start), np.float32))
        got.append(out)
    np.testing.assert_allclose(np.concatenate(got), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, want_state, rtol=1e-6)


def test_only_the_real_rows_of_a_padded_chunk_enter_the_state():
    rng = np.random.default_rng(6)
    qkv = rng.normal(size=(3 * CHANNELS, 8)).astype(np.float32)
    weight = rng.normal(size=(CHANNELS, KERNEL)).astype(np.float32)
    state = np.zeros((CHANNELS, KERNEL - 1), np.float32)
    short_conv(qkv, weight, state, 5, np.empty((8, CHANNELS), np.float32), np.empty((CHANNELS, KERNEL + 7), np.float32))
    _, want_state = short_conv_by_token(qkv[:, :5], weight, np.zeros((CHANNELS, KERNEL - 1)))
    np.testing.assert_allclose(state, want_state, rtol=1e-6)


DELTA = {"attn_type": "gated_delta_rule", "num_k_heads": 2, "num_v_heads": 4, "head_k_dim": 8, "head_v_dim": 6}
DELTA_CHANNELS, DELTA_KERNEL = 2 * 2 * 8 + 4 * 6, 4


def delta_inputs(seq: int, seed: int) -> tuple[np.ndarray, ...]:
    """qkv, conv weight, gate (a log-decay, negative) and beta (in 0..1) as the exporter's graph makes them."""
    rng = np.random.default_rng(seed)
    qkv = rng.normal(size=(DELTA_CHANNELS, seq)).astype(np.float32)
    weight = rng.normal(scale=0.5, size=(DELTA_CHANNELS, DELTA_KERNEL)).astype(np.float32)
    gate = -np.log1p(np.exp(rng.normal(size=(seq, 4)))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.normal(size=(seq, 4))))).astype(np.float32)
    return qkv, weight, gate, beta


def run_delta_rule(qkv, weight, gate, beta, pieces, l2norm: bool = True, rows: int | None = None):
    """The CPU kernel over `pieces` (start, stop) in turn, one state carried through; (out, parts)."""
    table = param(**DELTA, use_qk_l2norm=l2norm)
    parts = {"conv": np.zeros((DELTA_CHANNELS, DELTA_KERNEL - 1), np.float32),
             "recurrent": np.zeros((4, 8, 6), np.float32)}
    outs = []
    for start, stop in pieces:
        out = np.full((stop - start, 4 * 6), np.nan, np.float32)
        gated_delta_rule(np.ascontiguousarray(qkv[:, start:stop]), weight, gate[start:stop], beta[start:stop],
                         parts, table, stop - start if rows is None else rows, out)
        outs.append(out)
    return np.concatenate(outs), parts


def delta_truth(qkv, weight, gate, beta, l2norm: bool = True):
    return numpy_reference.gated_delta_net(qkv, weight, gate, beta, 2, 4, 8, 6,
                                           np.zeros((DELTA_CHANNELS, DELTA_KERNEL - 1)), np.zeros((4, 8, 6)), l2norm)


@pytest.mark.parametrize("l2norm", [True, False])
def test_the_gated_delta_rule_matches_a_per_token_loop_across_chunks(l2norm):
    seq = 2 * CHUNK + 21
    qkv, weight, gate, beta = delta_inputs(seq, seed=7)
    want, want_history, want_state = delta_truth(qkv, weight, gate, beta, l2norm)
    # a prefill of more than one chunk, then a decode step, then a prefill that ends mid-chunk
    got, parts = run_delta_rule(qkv, weight, gate, beta, [(0, CHUNK + 30), (CHUNK + 30, CHUNK + 31),
                                                          (CHUNK + 31, seq)], l2norm)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale)
    np.testing.assert_allclose(parts["conv"], want_history, rtol=1e-6)
    np.testing.assert_allclose(parts["recurrent"], want_state, rtol=0, atol=2e-5 * np.abs(want_state).max())


def test_a_chunked_delta_rule_prefill_equals_token_by_token():
    seq = CHUNK + 9
    qkv, weight, gate, beta = delta_inputs(seq, seed=8)
    whole, whole_parts = run_delta_rule(qkv, weight, gate, beta, [(0, seq)])
    steps, step_parts = run_delta_rule(qkv, weight, gate, beta, [(t, t + 1) for t in range(seq)])
    np.testing.assert_allclose(whole, steps, rtol=0, atol=1e-5 * np.abs(steps).max())
    for name in ("conv", "recurrent"):
        np.testing.assert_allclose(whole_parts[name], step_parts[name], rtol=0,
                                   atol=1e-5 * np.abs(step_parts[name]).max())


def test_only_the_real_rows_of_a_padded_chunk_enter_the_delta_rule_state():
    qkv, weight, gate, beta = delta_inputs(12, seed=9)
    got, parts = run_delta_rule(qkv, weight, gate, beta, [(0, 12)], rows=7)
    want, want_history, want_state = delta_truth(qkv[:, :7], weight, gate[:7], beta[:7])
    np.testing.assert_allclose(got[:7], want, rtol=0, atol=2e-5 * np.abs(want).max())
    assert not got[7:].any()
    np.testing.assert_allclose(parts["conv"], want_history, rtol=1e-6)
    np.testing.assert_allclose(parts["recurrent"], want_state, rtol=0, atol=2e-5 * np.abs(want_state).max())


@pytest.mark.parametrize("kernel", ["parallel", "serial", "numpy twin"])
def test_each_delta_rule_kernel_matches_a_per_token_loop(kernel):
    """The compiled kernels (a head per thread; one thread for decode) and the chunked numpy twin
    that stands in while they compile, over more than one of the twin's chunks, from a nonzero state."""
    seq = CHUNK + 23
    qkv, weight, gate, beta = delta_inputs(seq, seed=12)
    start_state = np.random.default_rng(13).normal(scale=0.3, size=(4, 8, 6)).astype(np.float32)
    history = np.zeros((DELTA_CHANNELS, DELTA_KERNEL - 1))
    want, _, want_state = numpy_reference.gated_delta_net(qkv, weight, gate, beta, 2, 4, 8, 6, history, start_state)
    mixed = np.empty((seq, DELTA_CHANNELS), np.float32)
    kernels.conv_silu_rows_numpy(np.ascontiguousarray(qkv.T), np.ascontiguousarray(weight.T),
                                 history.astype(np.float32), seq, np.empty((seq + DELTA_KERNEL - 1, DELTA_CHANNELS),
                                                                           np.float32), mixed)
    run = {"parallel": kernels.delta_rule_rows, "serial": kernels.delta_rule_rows_serial,
           "numpy twin": kernels.delta_rule_rows_numpy}[kernel]
    state, out = start_state.copy(), np.full((seq + 2, 4 * 6), np.nan, np.float32)
    run(np.concatenate([mixed, mixed[:2]]), np.concatenate([gate, gate[:2]]), np.concatenate([beta, beta[:2]]),
        state, 2, True, seq, out)
    np.testing.assert_allclose(out[:seq], want, rtol=0, atol=2e-5 * np.abs(want).max())
    assert not out[seq:].any()   # rows past `rows` (a padded chunk's) are zero and leave the state alone
    np.testing.assert_allclose(state, want_state, rtol=0, atol=2e-5 * np.abs(want_state).max())


def test_the_convolution_kernel_matches_its_numpy_twin_and_keeps_the_last_real_inputs():
    qkv, weight, _, _ = delta_inputs(9, seed=14)
    rows, taps = np.ascontiguousarray(qkv.T), np.ascontiguousarray(weight.T)
    start = np.random.default_rng(15).normal(size=(DELTA_CHANNELS, DELTA_KERNEL - 1)).astype(np.float32)
    results = []
    for run in (kernels.conv_silu_rows, kernels.conv_silu_rows_numpy):
        state, out = start.copy(), np.empty((9, DELTA_CHANNELS), np.float32)
        run(rows, taps, state, 6, np.empty((9 + DELTA_KERNEL - 1, DELTA_CHANNELS), np.float32), out)
        results.append((out, state))
    (got, got_state), (twin, twin_state) = results
    np.testing.assert_allclose(got, twin, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got_state, twin_state)
    np.testing.assert_array_equal(got_state, np.concatenate([start, qkv], axis=1)[:, 6: 6 + DELTA_KERNEL - 1])


class LayerRuns:
    """One LinearAttention node on a CPU backend, run over token rows of its inputs as the engine's
    forwards drive it (KVMeta add, verify, remove); an execution per row count, one state."""

    def __init__(self, table: LinearAttentionParam, qkv: np.ndarray, weight: np.ndarray, gate: np.ndarray,
                 beta: np.ndarray):
        self.backend = CPUBackend(BackendConfig(precision="high", thread_num=2, keep_tensors=True), KVMeta())
        self.node = Node("LinearAttention", "/layers.0/la", table)
        self.qkv, self.weight, self.gate, self.beta = qkv, weight, gate, beta
        self.ops: dict[int, OneOp] = {}

    def forward(self, start: int, stop: int, verify: bool = False, remove: int = 0) -> np.ndarray:
        """The output of rows start..stop; `remove`: rows of the last forward the cache drops first."""
        arrays = [self.qkv[start:stop, :, None, None], self.gate[None, start:stop], self.beta[None, start:stop],
                  self.weight[:, None, :]]
        if stop - start not in self.ops:
            self.ops[stop - start] = OneOp(self.backend, self.node, arrays, host=(3,))
        meta = self.backend.kv_meta
        meta.remove, meta.add, meta.verify = remove, stop - start, verify
        (out,) = self.ops[stop - start](*arrays)
        meta.sync()
        return out

    def state(self) -> dict[str, np.ndarray]:
        return self.backend.state_caches[self.node.name].read()


def layer_inputs(table: LinearAttentionParam, seq: int, seed: int) -> tuple[np.ndarray, ...]:
    """Token-row qkv (seq, channels), a conv weight (channels, kernel), gate and beta (seq, v heads)."""
    rng = np.random.default_rng(seed)
    channels = linear_attention.qkv_channels(table)
    qkv = rng.normal(size=(seq, channels)).astype(np.float32)
    weight = rng.normal(scale=0.5, size=(linear_attention.conv_channels(table), DELTA_KERNEL)).astype(np.float32)
    gate = -np.log1p(np.exp(rng.normal(size=(seq, table.num_v_heads)))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.normal(size=(seq, table.num_v_heads))))).astype(np.float32)
    return qkv, weight, gate, beta


@pytest.mark.parametrize("fields", [DELTA, {}], ids=["gated_delta_rule", "short_conv"])
@pytest.mark.parametrize("removed", [1, 3, 5])
def test_a_verify_forward_then_a_remove_equals_a_forward_of_the_kept_rows(fields, removed):
    """A prompt of 9 rows, a verify block of 6 rows of which the next forward removes `removed`,
    then one more row: bit for bit what the prompt, the kept rows and that row leave (state and
    output), and a remove reaching before the block is still refused."""
    table = param(**fields)
    inputs = layer_inputs(table, 16, seed=11)
    kept = 6 - removed
    spec, plain = LayerRuns(table, *inputs), LayerRuns(table, *inputs)
    spec.forward(0, 9)
    spec.forward(9, 15, verify=True)
    plain.forward(0, 9)
    plain.forward(9, 9 + kept)
    assert spec.backend.state_caches[spec.node.name].undoable == 6
    # the row after the kept ones: row 15 stands in for the token the sampler picked
    np.testing.assert_array_equal(spec.forward(15, 16, remove=removed), plain.forward(15, 16))
    for name, part in plain.state().items():
        np.testing.assert_array_equal(spec.state()[name], part)
    assert spec.backend.state_caches[spec.node.name].undoable == 0   # only a verify forward can be taken back
    with pytest.raises(StateRollbackError, match="cannot be rolled back"):
        spec.forward(15, 16, remove=1)


def test_the_cpu_state_cache_follows_the_protocol():
    cache = HostStateCache({"conv": (CHANNELS, KERNEL - 1)})
    assert isinstance(cache, StateCache) and cache.nbytes == CHANNELS * (KERNEL - 1) * 4
    parts = {"conv": np.arange(CHANNELS * (KERNEL - 1), dtype=np.float32).reshape(CHANNELS, KERNEL - 1)}
    cache.write(parts)
    np.testing.assert_array_equal(cache.read()["conv"], parts["conv"])
    cache.reset()
    assert not cache.read()["conv"].any()
    with pytest.raises(ValueError):
        cache.write({"conv": np.zeros((CHANNELS, KERNEL))})


def test_kv_meta_decides_when_the_state_continues():
    meta = KVMeta()
    assert state_step(meta, "layer") is False           # nothing cached: start from zero
    meta.add = 4
    meta.sync()
    assert state_step(meta, "layer") is True            # the next chunk or decode step continues
    meta.clear()
    assert state_step(meta, "layer") is False           # reset(): the whole cache goes, the state too
    meta.previous, meta.remove = 6, 2
    with pytest.raises(StateRollbackError, match="cannot be rolled back"):
        state_step(meta, "layer")


def param(**changes) -> LinearAttentionParam:
    fields = {"attn_type": "short_conv", "num_k_heads": 1, "num_v_heads": 1, "head_k_dim": CHANNELS,
              "head_v_dim": CHANNELS}
    return LinearAttentionParam(**{**fields, **changes})


def test_the_shape_rule_names_the_op_and_the_field():
    from mnngpu.backend import Tensor

    node = Node("LinearAttention", "/layers.0/la", param())
    weight = Tensor((CHANNELS, 1, KERNEL), np.dtype(np.float32))
    rows = Tensor((9, 3 * CHANNELS, 1, 1), np.dtype(np.float32))
    assert linear_attention.linear_attention(node, [rows, rows, rows, weight])[0][0] == (9, CHANNELS, 1, 1)
    sequence = Tensor((1, 3 * CHANNELS, 9), np.dtype(np.float32))
    assert linear_attention.linear_attention(node, [sequence, rows, rows, weight])[0][0] == (1, 9, 1, CHANNELS)
    wrong = Tensor((9, 3 * CHANNELS + 3, 1, 1), np.dtype(np.float32))
    with pytest.raises(ModelFormatError) as error:
        linear_attention.linear_attention(node, [wrong, rows, rows, weight])
    assert error.value.field == "/layers.0/la.head_v_dim" and "LinearAttention" in str(error.value)


def test_the_table_checks_and_the_refused_mode():
    assert linear_attention.decline_table(param()) is None
    assert linear_attention.decline_table(param(attn_type="mamba"))[0] == "attn_type"
    assert linear_attention.decline_table(param(head_v_dim=0))[0] == "head_v_dim"
    delta = param(attn_type="gated_delta_rule", num_k_heads=2, num_v_heads=3)
    assert linear_attention.decline_table(delta)[0] == "num_v_heads"
    # a C4 export's gate_fold is rewritten at load (runtime/c4_ops.py); the op itself never takes one
    assert linear_attention.decline_table(param(**DELTA, gate_fold=True)) is None
    assert linear_attention.decline_mode(param(**DELTA)) is None
    assert linear_attention.decline_mode(param()) is None


# ---- the lfm2 fixture ----------------------------------------------------------------------------

def load(name: str = MODEL, **overrides):
    model = mnngpu_llm.create(FIXTURES / name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.set_config({"precision": "high", "thread_num": 2, **overrides})
        model.load()
    return model


def greedy(model, ids: list[int], steps: int = 8) -> tuple[list[int], np.ndarray]:
    logits = np.asarray(model.forward(ids))[0, -1]
    first, tokens = logits.copy(), [int(np.argmax(logits))]
    while len(tokens) < steps:
        tokens.append(int(np.argmax(np.asarray(model.forward([tokens[-1]]))[0, -1])))
    return tokens, first


@pytest.mark.parametrize("name", MODELS)
def test_a_prompt_after_reset_gives_what_a_fresh_load_gives(name):
    ref, _ = reference(name)
    first, second = ref["prompts"][1]["ids"], ref["prompts"][2]["ids"]
    model = load(name)
    greedy(model, first)
    model.reset()
    again, again_logits = greedy(model, second)
    fresh, fresh_logits = greedy(load(name), second)
    assert again == fresh
    np.testing.assert_array_equal(again_logits, fresh_logits)


@pytest.mark.parametrize("name", MODELS)
def test_chunked_prefill_carries_the_state(name):
    ids = reference(name)[0]["prompts"][4]["ids"]
    whole, whole_logits = greedy(load(name), ids)
    chunked, chunked_logits = greedy(load(name, chunk=7), ids)
    assert chunked == whole
    np.testing.assert_allclose(chunked_logits, whole_logits, rtol=0, atol=1e-4 * whole_logits.std())


def test_the_state_is_kept_per_layer_and_counted_with_the_kv_cache():
    model = load()
    model.forward(reference(MODEL)[0]["prompts"][0]["ids"])
    backend = model.runtime.backend()
    assert isinstance(backend, CPUBackend)
    assert sorted(backend.state_caches) == ["/layers.0/self_attn/FusedLinearAttention",
                                            "/layers.2/self_attn/FusedLinearAttention"]
    state_bytes = sum(state.nbytes for state in backend.state_caches.values())
    assert state_bytes == 2 * 128 * 2 * 4   # two layers, 128 channels, kernel 3 - 1 inputs, float32
    assert cache_nbytes(backend) == state_bytes + sum(cache.nbytes for cache in backend.kv_caches.values())


def test_a_delta_rule_layer_keeps_its_convolution_inputs_and_a_matrix_per_v_head():
    model = load("qwen3_5_int4_b64")
    model.forward(reference("qwen3_5_int4_b64")[0]["prompts"][0]["ids"])
    backend = model.runtime.backend()
    assert sorted(backend.state_caches) == [f"/layers.{i}/self_attn/FusedLinearAttention" for i in range(3)]
    # q, k (2 heads x 16 each) and v (4 heads x 16) through a kernel of 4; a 16 x 16 matrix per v head
    shapes = {"conv": (2 * 2 * 16 + 4 * 16, 3), "recurrent": (4, 16, 16)}
    assert all(state.shapes == shapes for state in backend.state_caches.values())
    assert all(state.read()["recurrent"].any() for state in backend.state_caches.values())
    assert cache_nbytes(backend) == (3 * 4 * (128 * 3 + 4 * 16 * 16)
                                     + sum(cache.nbytes for cache in backend.kv_caches.values()))


def test_dropping_cached_tokens_behind_the_state_is_refused():
    model = load()
    model.forward([5, 6, 7])
    model.runtime.kv_meta.remove = 1
    with pytest.raises(StateRollbackError):
        model.forward([8])


def test_backends_without_a_kernel_decline_it_with_the_reason():
    from mnngpu.backend import backend_class
    from mnngpu.errors import BackendUnavailableError

    for backend_type in ("cuda",):
        try:
            caps = backend_class(backend_type).caps
        except BackendUnavailableError:
            continue
        assert caps.declines["LinearAttention"] == linear_attention.NO_DEVICE_KERNEL
    assert CPUBackend(BackendConfig()).executions["LinearAttention"].__name__ == "CPULinearAttention"
