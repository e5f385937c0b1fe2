"""LinearAttention on the device backends (opencl, vulkan) against numpy truths written apart from
every kernel: tests/reference.py's per-token gated delta rule, and a per-token short convolution.

One node is driven the way the engine drives it (KVMeta add, verify, remove, clear): a padded
prefill chunk whose padding must not reach the state, decode steps and a full chunk carrying the
state on, a reset, a verify block partly taken back, and the state read and written from the host
(the prefix cache's path).
"""

from __future__ import annotations

import numpy as np
import pytest

from mnngpu.backend import Node
from mnngpu.backend.kv import KVMeta, StateCache
from mnngpu.backend.sequences import read_states, write_states
from mnngpu.errors import MnnGpuError
from mnngpu.format.params import LinearAttentionParam
from mnngpu.ops import linear_attention
from tests import reference as numpy_reference
from tests.backend.harness import OneOp, close, make, stored
from tests.test_linear_attention import short_conv_by_token

KINDS = ["opencl-cpu", "opencl-cpu-fp16", "vulkan-cpu"]
KERNEL = 4
CHUNK = 8   # the padded chunk's rows
TABLES = {
    "gated_delta_rule": {"attn_type": "gated_delta_rule", "num_k_heads": 2, "num_v_heads": 4, "head_k_dim": 8,
                         "head_v_dim": 6, "use_qk_l2norm": True},
    "short_conv": {"attn_type": "short_conv", "num_k_heads": 1, "num_v_heads": 1, "head_k_dim": 6, "head_v_dim": 6},
}


def table(mode: str) -> LinearAttentionParam:
    return LinearAttentionParam(**TABLES[mode])


def layer_inputs(param: LinearAttentionParam, seq: int, seed: int, backend) -> tuple[np.ndarray, ...]:
    """qkv (seq, channels), conv weight (channels, kernel), gate (a log-decay) and beta (in 0..1),
    (seq, v heads), rounded to what the backend's storage holds."""
    rng = np.random.default_rng(seed)
    qkv = rng.normal(size=(seq, linear_attention.qkv_channels(param)))
    weight = rng.normal(scale=0.5, size=(linear_attention.conv_channels(param), KERNEL)).astype(np.float32)
    gate = -np.log1p(np.exp(rng.normal(size=(seq, param.num_v_heads))))
    beta = 1 / (1 + np.exp(-rng.normal(size=(seq, param.num_v_heads))))
    if param.attn_type == "short_conv":
        gate, beta = np.zeros_like(gate), np.zeros_like(beta)
    return stored(backend, qkv), weight, stored(backend, gate), stored(backend, beta)


def truth(param: LinearAttentionParam, qkv, weight, gate, beta) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The layer over rows qkv (seq, channels) from zero state: (out (seq, width), state parts)."""
    history = np.zeros((weight.shape[0], KERNEL - 1))
    if param.attn_type == "short_conv":
        out, conv = short_conv_by_token(qkv.T.astype(np.float64), weight, history)
        return out, {"conv": conv}
    p = param
    out, conv, state = numpy_reference.gated_delta_net(
        qkv.T, weight, gate, beta, p.num_k_heads, p.num_v_heads, p.head_k_dim, p.head_v_dim, history,
        np.zeros((p.num_v_heads, p.head_k_dim, p.head_v_dim)), p.use_qk_l2norm)
    return out, {"conv": conv, "recurrent": state}


class DeviceLayer:
    """One LinearAttention node on a device backend; an execution (a module) per row count, one state."""

    def __init__(self, backend, param: LinearAttentionParam, inputs, rows_first: bool = True):
        self.backend, self.rows_first = backend, rows_first
        self.node = Node("LinearAttention", "/layers.0/linear_attn", param)
        self.qkv, self.weight, self.gate, self.beta = inputs
        self.ops: dict[int, OneOp] = {}

    def arrays(self, start: int, stop: int) -> list[np.ndarray]:
        qkv = self.qkv[start:stop]
        qkv = qkv[:, :, None, None] if self.rows_first else np.ascontiguousarray(qkv.T)[None]
        return [qkv, self.gate[None, start:stop], self.beta[None, start:stop], self.weight[:, None, :]]

    def forward(self, start: int, stop: int, real: int | None = None, verify: bool = False,
                remove: int | None = None) -> np.ndarray:
        """Rows start..stop as one forward, of which the first `real` count (KVMeta add); `remove`:
        rows of the last forward dropped first (None: what KVMeta says, e.g. after clear())."""
        arrays = self.arrays(start, stop)
        if stop - start not in self.ops:
            self.ops[stop - start] = OneOp(self.backend, self.node, arrays, host=(3,))
        meta = self.backend.kv_meta
        meta.add, meta.verify = stop - start if real is None else real, verify
        if remove is not None:
            meta.remove = remove
        (out,) = self.ops[stop - start](*arrays)
        meta.sync()
        return out.reshape(stop - start, -1)

    @property
    def state(self) -> StateCache:
        return self.backend.state_caches[self.node.name]


def assert_state(backend, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name, part in want.items():
        close(backend, got[name], part)


@pytest.mark.parametrize("rows_first", [True, False], ids=["token_rows", "channels_by_seq"])
@pytest.mark.parametrize("mode", list(TABLES))
@pytest.mark.parametrize("kind", KINDS)
def test_chunks_decode_steps_and_a_reset_match_the_per_token_truth(kind, mode, rows_first):
    backend = make(kind)
    param = table(mode)
    inputs = layer_inputs(param, 30, seed=3, backend=backend)
    layer = DeviceLayer(backend, param, inputs, rows_first)
    qkv, weight, gate, beta = inputs
    # a chunk of which 5 rows are real (rows 5..7 are padding), three decode steps from row 5, a full chunk
    outs = [layer.forward(0, CHUNK, real=5)[:5]]
    outs += [layer.forward(t, t + 1) for t in range(5, 8)]
    outs.append(layer.forward(8, 8 + CHUNK))
    want, want_state = truth(param, qkv[:16], weight, gate[:16], beta[:16])
    close(backend, np.concatenate(outs), want)
    assert_state(backend, layer.state.read(), want_state)
    if mode == "gated_delta_rule":   # the padded rows' output is zero, as on the CPU
        assert not layer.forward(16, 16 + CHUNK, real=3)[3:].any()
    backend.kv_meta.clear()   # reset(): the next forward starts from zero state
    got = layer.forward(20, 20 + CHUNK)
    fresh, fresh_state = truth(param, qkv[20:28], weight, gate[20:28], beta[20:28])
    close(backend, got, fresh)
    assert_state(backend, layer.state.read(), fresh_state)


@pytest.mark.parametrize("mode", list(TABLES))
@pytest.mark.parametrize("removed", [1, 4, 6])
@pytest.mark.parametrize("kind", KINDS)
def test_a_verify_block_taken_back_equals_a_forward_of_the_kept_rows(kind, mode, removed):
    """A prompt chunk, a verify block of 6 rows of which the next forward removes `removed`, then
    one more row: what the chunk, the kept rows and that row give without the block."""
    param = table(mode)
    spec_backend, plain_backend = make(kind), make(kind)
    inputs = layer_inputs(param, 20, seed=4, backend=spec_backend)
    spec, plain = DeviceLayer(spec_backend, param, inputs), DeviceLayer(plain_backend, param, inputs)
    kept = 6 - removed
    spec.forward(0, CHUNK, real=7)
    spec.forward(7, 13, verify=True)
    assert spec.state.undoable == 6
    plain.forward(0, CHUNK, real=7)
    if kept:
        plain.forward(7, 7 + kept)
    np.testing.assert_array_equal(spec.forward(13, 14, remove=removed), plain.forward(13, 14))
    for name, part in plain.state.read().items():
        np.testing.assert_array_equal(spec.state.read()[name], part)
    assert spec.state.undoable == 0


@pytest.mark.parametrize("mode", list(TABLES))
@pytest.mark.parametrize("kind", KINDS)
def test_the_state_goes_through_the_host_as_the_prefix_cache_moves_it(kind, mode):
    """read_states after a prompt, written into a second backend before its layer first runs (a
    prefix restored at load), continues exactly as the first backend does."""
    param = table(mode)
    first, second = make(kind), make(kind)
    inputs = layer_inputs(param, 12, seed=5, backend=first)
    a, b = DeviceLayer(first, param, inputs), DeviceLayer(second, param, inputs)
    a.forward(0, CHUNK)
    states = read_states(first)
    assert isinstance(a.state, StateCache) and a.state.nbytes >= sum(p.nbytes for p in states[a.node.name].values())
    write_states(second, states)
    second.kv_meta.previous = CHUNK   # the restored prefix's tokens
    np.testing.assert_array_equal(b.forward(CHUNK, CHUNK + 1), a.forward(CHUNK, CHUNK + 1))
    for name, part in a.state.read().items():
        np.testing.assert_array_equal(b.state.read()[name], part)
    b.state.reset()
    assert not any(part.any() for part in b.state.read().values())


@pytest.mark.parametrize("mode", list(TABLES))
def test_opencl_follows_the_state_caches_of_the_sequence_the_backend_runs(mode):
    """Two sequences through the same prepared kernels, the backend's kv_meta and state_caches
    swapped between them (as a sequence switch does): each continues its own state."""
    backend = make("opencl-cpu")
    param = table(mode)
    inputs = layer_inputs(param, 12, seed=6, backend=backend)
    layer = DeviceLayer(backend, param, inputs)
    first = (backend.kv_meta, backend.state_caches)
    layer.forward(0, CHUNK, real=4)
    second = (KVMeta(), {})
    backend.kv_meta, backend.state_caches = second
    other = layer.forward(4, 4 + CHUNK, real=4)[:4]
    backend.kv_meta, backend.state_caches = first
    tail = layer.forward(4, 5)
    qkv, weight, gate, beta = inputs
    want, _ = truth(param, qkv[:5], weight, gate[:5], beta[:5])
    close(backend, tail, want[4:])
    want_other, want_state = truth(param, qkv[4:8], weight, gate[4:8], beta[4:8])
    close(backend, other, want_other)
    assert_state(backend, second[1][layer.node.name].read(), want_state)


def test_vulkan_refuses_a_state_its_recorded_commands_do_not_hold():
    backend = make("vulkan-cpu")
    param = table("short_conv")
    layer = DeviceLayer(backend, param, layer_inputs(param, 2 * CHUNK, seed=7, backend=backend))
    layer.forward(0, CHUNK)
    backend.state_caches = {}   # another sequence's, through the module recorded for the first
    with pytest.raises(MnnGpuError, match="recorded commands hold one sequence's recurrent state"):
        layer.forward(CHUNK, 2 * CHUNK)
