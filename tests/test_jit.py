"""Cold starts: each CPU kernel's numpy twin computes what the kernel computes; a run on an empty
kernel cache starts on the twins, gives the same tokens, and leaves a cache that the next run
uses without compiling anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numba
import numpy as np
import pytest

from mnngpu import jit
from mnngpu.backends.cpu.kernels import fastmath, lane_kernels
from mnngpu.backends.cpu.kernels import linear_kernels as kernels
from mnngpu.backends.cpu.ops import attention, norm, rope
from tests import reference

RNG_SEED = 7


class _Layer:
    """codes, alpha, k in the kernels' layout, and the float64 weights they stand for, as the
    levels' part (levels * scale) and the zero points' part."""

    def __init__(self, rng, oc: int, ic: int, bits: int, block: int):
        levels, scales, zeros = reference.random_levels(rng, oc, ic, bits, block)
        self.codes = reference.pack_high_nibble_first(levels) if bits == 4 else levels
        self.alpha = np.ascontiguousarray(np.stack([zeros, scales], axis=-1))   # (min, scale), k = 0
        self.k = np.float32(0.0)
        self.weights = self._parts(levels, scales, zeros, block)[0]
        # precision low's lane groups keep (min, scale) in float16
        _, self.level_part, self.zero_part = self._parts(levels, scales.astype(np.float16),
                                                         zeros.astype(np.float16), block)

    @staticmethod
    def _parts(levels, scales, zeros, block) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        level_part = levels.astype(np.float64) * np.repeat(scales.astype(np.float64), block, 1)
        zero_part = np.repeat(zeros.astype(np.float64), block, 1)
        return level_part + zero_part, level_part, zero_part

    def times(self, x: np.ndarray, quantized: bool, levels: int = 32767) -> np.ndarray:
        """x [..., ic] times the layer; quantized: as precision low's integer kernels compute it
        (x rounded per chunk to steps of max|chunk| / levels: int16's, or int8's 127; the alpha
        rounded to float16)."""
        if not quantized:
            return x @ self.weights.T
        rows = reference.integer_chunks(x.reshape(-1, x.shape[-1]), levels).reshape(x.shape)
        return rows @ self.level_part.T + x @ self.zero_part.T


def _gemv_scratch(ic: int, block: int) -> tuple:
    return tuple(buffer[0] for buffer in kernels.row_buffers(1, ic, block))


def _both(kernel, make_args, outputs: tuple[int, ...]) -> list[tuple]:
    """Run the kernel and its twin on equal fresh arguments; the pairs of their outputs."""
    twin = jit.TWINS[kernel]
    got_kernel, got_twin = make_args(), make_args()
    jit.runnable(kernel, got_kernel)(*got_kernel)   # compiled here: the suite runs without stand-ins
    twin(*got_twin)
    return [(got_kernel[i], got_twin[i]) for i in outputs]


def _matrices(layers: list[_Layer]) -> tuple:
    return (tuple(layer.codes for layer in layers), tuple(layer.alpha for layer in layers),
            tuple(layer.k for layer in layers))


def _lane_matrices(layers: list[_Layer]) -> tuple:
    packed = [lane_kernels.pack(layer.codes, layer.alpha) for layer in layers]
    return tuple(codes for codes, _ in packed), tuple(alpha for _, alpha in packed), tuple(layer.k for layer in layers)


@pytest.mark.parametrize("bits, block", [(4, 64), (4, 32), (8, 64), (8, 0)])
@pytest.mark.parametrize("kernel", [kernels.gemv_group, kernels.gemv_group_serial])
def test_gemv_group_twin(kernel, bits, block):
    rng = np.random.default_rng(RNG_SEED)
    ic = 256
    block = block or ic
    layers = [_Layer(rng, oc, ic, bits, block) for oc in (96, 40)]
    bias = [rng.normal(size=96).astype(np.float32), np.zeros(0, np.float32)]
    x = rng.normal(size=ic).astype(np.float32)

    def args():
        return (*_matrices(layers), tuple(bias), kernels.row_spans([96, 40]), x, bits == 4,
                block, *_gemv_scratch(ic, block), (np.empty(96, np.float32), np.empty(40, np.float32)))

    (compiled, twin), = _both(kernel, args, (11,))
    for m, layer in enumerate(layers):
        want = layer.times(x, False) + (bias[m] if bias[m].size else 0)
        reference.assert_close(compiled[m], want, 1e-5)
        reference.assert_close(twin[m], want, 1e-5)


@pytest.mark.parametrize("kernel", [kernels.gemv_rows_group, kernels.gemv_rows_group_serial])
def test_gemv_rows_group_twin(kernel):
    rng = np.random.default_rng(RNG_SEED)
    rows, ic, block = 3, 128, 64
    layers = [_Layer(rng, oc, ic, 4, block) for oc in (96, 40)]
    empty = np.zeros(0, np.float32)
    xs = rng.normal(size=(rows, ic)).astype(np.float32)

    def args():
        return (*_matrices(layers), (empty, empty), kernels.row_spans([96, 40]), xs, True, block,
                *kernels.row_buffers(rows, ic, block),
                (np.empty((rows, 96), np.float32), np.empty((rows, 40), np.float32)))

    (compiled, twin), = _both(kernel, args, (11,))
    for m, layer in enumerate(layers):
        reference.assert_close(compiled[m], layer.times(xs, False), 1e-5)
        reference.assert_close(twin[m], layer.times(xs, False), 1e-5)


@pytest.mark.parametrize("kernel", [kernels.gemv_gated, kernels.gemv_gated_serial])
def test_gemv_gated_twin(kernel):
    rng = np.random.default_rng(RNG_SEED)
    ic, oc, block = 128, 80, 64
    gate, up = _Layer(rng, oc, ic, 4, block), _Layer(rng, oc, ic, 4, block)
    x = rng.normal(size=ic).astype(np.float32)
    empty = np.zeros(0, np.float32)

    def args():
        return (*_matrices([gate, up]), (empty, empty), kernels.row_spans([oc, oc]), x, True, block,
                *_gemv_scratch(ic, block), (np.empty(oc, np.float32), np.empty(oc, np.float32)),
                np.empty(oc, np.float32))

    (compiled, twin), = _both(kernel, args, (12,))
    want = reference.silu_mul(up.times(x, False), gate.times(x, False))
    reference.assert_close(compiled, want, 1e-4)
    reference.assert_close(twin, want, 1e-5)


# rows 1: a decode step; 6: a group of four rows sharing each unpacking, then two; 37: a prefill.
# oc 40: a lane group of 8 rows padded to 16.
# xq int16: precision low; int8: with int8_activations (127 levels a chunk, one byte dot per 4 inputs).
XQ_LEVELS = [(np.int16, 32767), (np.int8, 127)]


@pytest.mark.parametrize("xq_type, levels", XQ_LEVELS)
@pytest.mark.parametrize("rows, block", [(1, 64), (6, 128), (37, 64)])
@pytest.mark.parametrize("kernel", [lane_kernels.lanes_group, lane_kernels.lanes_group_serial])
def test_lanes_group_twin(kernel, rows, block, xq_type, levels):
    rng = np.random.default_rng(RNG_SEED)
    ic = 256
    layers = [_Layer(rng, oc, ic, 4, block) for oc in (96, 40)]
    bias = [rng.normal(size=96).astype(np.float32), np.zeros(0, np.float32)]
    xs = rng.normal(size=(rows, ic)).astype(np.float32)

    def args():
        return (*_lane_matrices(layers), tuple(bias), kernels.row_spans([96, 40]), xs, block,
                *lane_kernels.x_buffers(rows, ic, block, xq_type),
                (np.empty((rows, 96), np.float32), np.empty((rows, 40), np.float32)))

    (compiled, twin), = _both(kernel, args, (10,))
    for m, layer in enumerate(layers):
        want = layer.times(xs, True, levels) + (bias[m] if bias[m].size else 0)
        reference.assert_close(compiled[m], want, 1e-5)
        reference.assert_close(twin[m], want, 1e-5)


@pytest.mark.parametrize("xq_type, levels", XQ_LEVELS)
@pytest.mark.parametrize("kernel", [lane_kernels.lanes_gated, lane_kernels.lanes_gated_serial])
def test_lanes_gated_twin(kernel, xq_type, levels):
    rng = np.random.default_rng(RNG_SEED)
    rows, ic, oc, block = 5, 128, 80, 64
    gate, up = _Layer(rng, oc, ic, 4, block), _Layer(rng, oc, ic, 4, block)
    xs = rng.normal(size=(rows, ic)).astype(np.float32)
    empty = np.zeros(0, np.float32)

    def args():
        return (*_lane_matrices([gate, up]), (empty, empty), kernels.row_spans([oc, oc]), xs, block,
                *lane_kernels.x_buffers(rows, ic, block, xq_type),
                (np.empty((rows, oc), np.float32), np.empty((rows, oc), np.float32)), np.empty((rows, oc), np.float32))

    (compiled, twin), = _both(kernel, args, (11,))
    want = reference.silu_mul(up.times(xs, True, levels), gate.times(xs, True, levels))
    reference.assert_close(compiled, want, 1e-4)
    reference.assert_close(twin, want, 1e-5)


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("kernel", [norm.normed_lanes_group, norm.normed_lanes_group_serial,
                                    norm.normed_lanes_gated, norm.normed_lanes_gated_serial])
def test_normed_lanes_twin(kernel, residual):
    """The norm folded into a lane kernel (backends/cpu/ops/norm.py: fold_norms): the residual sum and the
    RMSNorm written out, and the layer applied to that norm."""
    rng = np.random.default_rng(RNG_SEED)
    rows, ic, oc, block = 3, 128, 48, 64
    gated = "gated" in kernel.py_func.__name__
    gate, up = _Layer(rng, oc, ic, 4, block), _Layer(rng, oc, ic, 4, block)
    a = rng.normal(size=(rows, ic)).astype(np.float32)
    b = rng.normal(size=(rows, ic)).astype(np.float32) if residual else np.zeros((0, ic), np.float32)
    gamma = rng.normal(size=ic).astype(np.float32)
    empty = np.zeros(0, np.float32)

    def args():
        sums, xs = np.empty((rows, ic), np.float32), np.empty((rows, ic), np.float32)
        outs = (np.empty((rows, oc), np.float32), np.empty((rows, oc), np.float32))
        linear = (*_lane_matrices([gate, up]), (empty, empty), kernels.row_spans([oc, oc]), xs, block,
                  *lane_kernels.x_buffers(rows, ic, block), outs)
        return (a, b, sums if residual else a, gamma, empty, 1e-6, True, *linear,
                *((np.empty((rows, oc), np.float32),) if gated else ()))

    (sums, sums_twin), (xs, xs_twin), (outs, outs_twin) = _both(kernel, args, (2, 12, 17))
    normed = reference.rms_norm(a + b if residual else a, gamma, 1e-6)
    for got in (xs, xs_twin):
        reference.assert_close(got, normed, 1e-5)
    if residual:
        assert np.array_equal(sums, a + b) and np.array_equal(sums_twin, a + b)
    if gated:
        last = (kernel.py_func.__code__.co_argcount - 1,)
        (compiled, twin), = _both(kernel, args, last)
        want = reference.silu_mul(up.times(normed, True), gate.times(normed, True))
    else:
        compiled, twin = outs[1], outs_twin[1]
        want = up.times(normed, True)
    reference.assert_close(compiled, want, 1e-4)
    reference.assert_close(twin, want, 1e-4)


def _parallel_loops(kernel, args) -> int:
    """How many parallel loops numba makes of `kernel` for these arguments, compiled afresh (a
    kernel loaded from the cache carries no diagnostics)."""
    options = {name: value for name, value in kernel.targetoptions.items() if name != "nopython"}
    fresh = numba.njit(**{**options, "cache": False})(kernel.py_func)
    signature = tuple(numba.typeof(arg) for arg in args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", numba.NumbaPerformanceWarning)
        fresh.compile(signature)
    return fresh.overloads[signature].metadata["parfor_diagnostics"].count_parfors()


@pytest.mark.parametrize("gated", [False, True])
def test_the_one_thread_lane_kernels_start_no_parallel_loop(gated):
    """They are built with parallel=True for numba's faster loop code; an array expression inlined
    into them (a block's x.sum()) became a parallel loop of its own, launched once per block of x
    on every call (a 16 x 896 matrix: 18.7 us instead of 1.4)."""
    rng = np.random.default_rng(RNG_SEED)
    ic, oc, block = 256, 32, 64
    layers = [_Layer(rng, oc, ic, 4, block) for _ in range(2 if gated else 1)]
    outs = tuple(np.empty((1, oc), np.float32) for _ in layers)
    args = (*_lane_matrices(layers), tuple(np.zeros(0, np.float32) for _ in layers),
            kernels.row_spans([oc] * len(layers)), rng.normal(size=(1, ic)).astype(np.float32), block,
            *lane_kernels.x_buffers(1, ic, block), outs)
    kernel = lane_kernels.lanes_gated_serial if gated else lane_kernels.lanes_group_serial
    assert _parallel_loops(kernel, (*args, np.empty((1, oc), np.float32)) if gated else args) == 0
    # with the norm folded in: still none on one thread, and the parallel kernel launches only the lane
    # kernel's own loops (the norm runs on the calling thread, as the unfolded norm step did)
    x = args[5]
    norm_args = (x, x, x.copy(), np.ones(ic, np.float32), np.zeros(0, np.float32), 1e-6, True)
    folded = (*norm_args, *args, *((np.empty((1, oc), np.float32),) if gated else ()))
    serial, parallel = ((norm.normed_lanes_gated_serial, norm.normed_lanes_gated) if gated else
                        (norm.normed_lanes_group_serial, norm.normed_lanes_group))
    assert _parallel_loops(serial, folded) == 0
    plain = lane_kernels.lanes_gated if gated else lane_kernels.lanes_group
    assert _parallel_loops(parallel, folded) == _parallel_loops(plain, folded[len(norm_args):])


# CPUs without AVX512-VNNI: numba compiles the lane dots for a Haswell (plain vector code), or
# for AVX512-VL with VNNI (the 256-bit dot instructions AVX-VNNI CPUs have); this CPU runs both.
_BASE_FEATURES = "+avx,+avx2,+fma,+f16c,+sse4.2,+popcnt,+bmi2"
LANE_DOT_TARGETS = [(0, _BASE_FEATURES), (256, _BASE_FEATURES + ",+avx512f,+avx512vl,+avx512vnni")]


def _host_has(features: str) -> bool:
    import llvmlite.binding as llvm

    return set(features.split(",")) <= set(llvm.get_host_cpu_features().flatten().split(","))


@pytest.mark.parametrize("width, features", LANE_DOT_TARGETS)
def test_lane_dots_of_cpus_without_512_bit_vnni(tmp_path, width, features):
    """The lane kernels' other dot-product forms, int16 and int8 x, compiled afresh for such a CPU."""
    if not _host_has(features):
        pytest.skip(f"this CPU cannot run code compiled for {features}")
    check = textwrap.dedent(f"""
        import numpy as np
        from mnngpu.backends.cpu.kernels import intrinsics, lane_kernels
        from tests import test_jit
        assert intrinsics.VNNI_WIDTH == {width}, intrinsics.VNNI_WIDTH
        for xq_type, levels in test_jit.XQ_LEVELS:
            test_jit.test_lanes_group_twin(lane_kernels.lanes_group, 6, 64, xq_type, levels)
            test_jit.test_lanes_gated_twin(lane_kernels.lanes_gated, xq_type, levels)
    """)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "NUMBA_CPU_NAME": "haswell",
           "NUMBA_CPU_FEATURES": features, jit.ENV_SWITCH: "0"}
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=900,
                          check=False, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-3000:]


def test_pack_groups_twin():
    """Both repack the same bytes, the rows past oc (40: three groups, the last half padding) zero."""
    rng = np.random.default_rng(RNG_SEED)
    layer = _Layer(rng, 40, 128, 4, 64)

    def args():
        return (layer.codes, layer.alpha, 1, 3, np.full((3, 2, 16, 16, 2), 7, np.uint8),
                np.full((3, 2, 2, 16), 7, np.float32))

    (compiled_codes, twin_codes), (compiled_alpha, twin_alpha) = _both(lane_kernels.pack_groups, args, (4, 5))
    np.testing.assert_array_equal(compiled_codes, twin_codes)
    np.testing.assert_array_equal(compiled_alpha, twin_alpha)
    assert (compiled_codes[0] == 7).all() and (compiled_codes[2, :, :, 8:] == 0).all()
    assert (compiled_alpha[2, :, :, 8:] == 0).all()


@pytest.mark.parametrize("bits", [4, 8])
def test_dequantize_rows_twin(bits):
    rng = np.random.default_rng(RNG_SEED)
    layer = _Layer(rng, 48, 128, bits, 32)

    def args():
        return layer.codes, layer.alpha, layer.k, bits == 4, 32, 8, np.empty((24, 128), np.float32)

    (compiled, twin), = _both(kernels.dequantize_rows, args, (6,))
    reference.assert_close(compiled, layer.weights[8:32], 1e-6)
    reference.assert_close(twin, layer.weights[8:32], 1e-6)


@pytest.mark.parametrize("kernel, shape", [(kernels.mul_silu, (5, 33)), (fastmath.silu_times, (70,))])
def test_silu_twins(kernel, shape):
    rng = np.random.default_rng(RNG_SEED)
    up, gate = (rng.normal(0, 4, size=shape).astype(np.float32) for _ in range(2))
    (compiled, twin), = _both(kernel, lambda: (up, gate, np.empty(shape, np.float32)), (2,))
    reference.assert_close(compiled, reference.silu_mul(up, gate), 1e-4)
    reference.assert_close(twin, reference.silu_mul(up, gate), 1e-6)


@pytest.mark.parametrize("rows", [1, 4])   # a decode step, a verify block
@pytest.mark.parametrize("kernel, int8, window, dim", [
    (attention.attend_rows, False, 0, 16), (attention.attend_rows, True, 0, 16),
    (attention.attend_rows, False, 4, 16), (attention.attend_rows, True, 5, 16),
    (attention.attend_rows_float, False, 0, 16), (attention.attend_rows_float, False, 4, 64),
    (attention.attend_rows_float, False, 0, 128)])
def test_attend_rows_twin(kernel, int8, window, dim, rows):
    rng = np.random.default_rng(RNG_SEED)
    heads, kv_heads, capacity, past = 4, 2, 48, 37   # the float kernel: two blocks of 16 keys, then one by one
    q = rng.normal(size=(rows, heads, dim)).astype(np.float32)
    keys, values = (rng.normal(size=(kv_heads, capacity, dim)).astype(np.float32) for _ in range(2))
    scales = [np.ones((kv_heads, capacity), np.float32), np.ones((kv_heads, capacity), np.float32)]
    if int8:   # codes and a scale per head and token, as the int8 KV cache stores them
        scales = [np.abs(a).max(axis=2) / 127 for a in (keys, values)]
        keys, values = (np.rint(a / s[:, :, None]).astype(np.int8) for a, s in zip((keys, values), scales))
    scale = np.float32(dim ** -0.5)

    def args():
        return (q, keys, scales[0], values, scales[1], past, window, scale,
                np.empty((rows, heads, past + rows), np.float32), np.empty((rows, heads, dim), np.float32))

    (compiled, twin), = _both(kernel, args, (9,))
    # the reference's layout: (seq, heads, dim), the rows after `past` cached keys
    total = past + rows
    k = (keys[:, :total] * scales[0][:, :total, None]).transpose(1, 0, 2)
    v = (values[:, :total] * scales[1][:, :total, None]).transpose(1, 0, 2)
    want = reference.causal_attention(q, k, v, past, float(scale), window)
    reference.assert_close(compiled, want, 1e-4)
    reference.assert_close(twin, want, 1e-5)


@pytest.mark.parametrize("kernel", [attention.attend_rows, attention.attend_rows_float])
def test_a_verify_row_of_attend_rows_is_its_decode_step_bit_for_bit(kernel):
    """Speculative decoding keeps a verified token's row only if it is what a decode step at that
    position computes: each of four rows equals the one-row call at its own position."""
    rng = np.random.default_rng(RNG_SEED)
    heads, kv_heads, dim, capacity, past = 4, 2, 64, 48, 13   # 14..17 keys: a key block (16) or not
    q = rng.normal(size=(4, heads, dim)).astype(np.float32)
    keys, values = (rng.normal(size=(kv_heads, capacity, dim)).astype(np.float32) for _ in range(2))
    ones = np.ones((kv_heads, capacity), np.float32)
    scale = np.float32(dim ** -0.5)

    def run(rows: slice, first: int) -> np.ndarray:
        count = rows.stop - rows.start
        args = (np.ascontiguousarray(q[rows]), keys, ones, values, ones, first, 0, scale,
                np.empty((count, heads, capacity), np.float32), np.empty((count, heads, dim), np.float32))
        jit.runnable(kernel, args)(*args)
        return args[9]

    together = run(slice(0, 4), past)
    for r in range(4):
        np.testing.assert_array_equal(together[r], run(slice(r, r + 1), past + r)[0])


@pytest.mark.parametrize("window", [0, 3])
def test_causal_softmax_twin(window):
    rng = np.random.default_rng(RNG_SEED)
    scores = rng.normal(0, 3, size=(6, 9)).astype(np.float32)
    (compiled, twin), = _both(attention.causal_softmax, lambda: (scores.copy(), 2, 4, window), (0,))
    visible = 4 + np.arange(6) // 2
    seen = np.arange(9) < visible[:, None]
    if window:   # rows see 3, 3, 3, 3, 3, 3 keys: the window cuts every row
        seen &= np.arange(9) >= visible[:, None] - window
    want = np.where(seen, np.exp(scores.astype(np.float64)), 0.0)
    want /= want.sum(axis=1, keepdims=True)
    reference.assert_close(compiled, want, 1e-4)
    reference.assert_close(twin, want, 1e-6)


@pytest.mark.parametrize("rms", [True, False])
def test_norm_rows_twin(rms):
    rng = np.random.default_rng(RNG_SEED)
    x = rng.normal(1, 2, size=(5, 40)).astype(np.float32)
    gamma, beta = rng.normal(size=40).astype(np.float32), rng.normal(size=40).astype(np.float32)
    beta_used = np.zeros(0, np.float32) if rms else beta
    (compiled, twin), = _both(norm.norm_rows, lambda: (x, gamma, beta_used, 1e-5, rms, np.empty_like(x)), (5,))
    want = reference.rms_norm(x, gamma, 1e-5) if rms else reference.layer_norm(x, gamma, beta, 1e-5)
    reference.assert_close(compiled, want, 1e-5)
    reference.assert_close(twin, want, 1e-5)


@pytest.mark.parametrize("split", [8, 5])
def test_rope_rotate_half_twin(split):
    rng = np.random.default_rng(RNG_SEED)
    seq, heads, dim = 3, 2, 16
    x = rng.normal(size=(seq, heads, dim)).astype(np.float32)
    cos, sin = (rng.normal(size=(seq, dim)).astype(np.float32) for _ in range(2))
    (compiled, twin), = _both(rope.rope_rotate_half, lambda: (x, cos, sin, split, np.empty_like(x)), (4,))
    rotated = np.concatenate([-x[..., split:], x[..., :split]], axis=-1)
    want = x * cos[:, None] + rotated * sin[:, None]
    reference.assert_close(compiled, want, 1e-6)
    reference.assert_close(twin, want, 1e-6)


# ---- a whole run on an empty cache ------------------------------------------------------------------------

RUN_SCRIPT = textwrap.dedent("""
    import json, sys
    from numba.core.registry import CPUDispatcher
    from mnngpu import jit, llm
    from mnngpu.demo import demo_model_dir

    model = llm.create(str(demo_model_dir() / "config.json"))
    model.set_config({"sampler_type": "greedy", "thread_num": 2})
    model.load()
    ids = model.tokenizer_encode("Once upon a time")
    report = {"tokens": model.generate(ids, max_new_tokens=12)}
    report.update(standins=len(jit._STANDINS), pending=jit.pending())
    if sys.argv[1] == "wait":
        jit.wait_for_compiles()
        model.reset()
        report["tokens_after"] = model.generate(ids, max_new_tokens=12)
        # a stand-in switches to its kernel at its next call; a load-time one (the lane repacking)
        # has none after load, so it counts as compiled once its background job is done
        report["all_compiled"] = all(s.compiled or jit.BACKGROUND.done(s.job) for s in jit._STANDINS.values())
    report["misses"] = sorted(f"{name}.{attr}" for name, module in list(sys.modules.items())
                              if name.startswith("mnngpu") for attr, value in vars(module).items()
                              if isinstance(value, CPUDispatcher) and sum(value.stats.cache_misses.values()))
    print(json.dumps(report))
""")


def _run(mode: str, cache) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), jit.ENV_SWITCH: "1"}
    done = subprocess.run([sys.executable, "-c", RUN_SCRIPT, mode], env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


def test_cold_cache_runs_on_twins_then_the_cache_is_used(tmp_path):
    from mnngpu import llm
    from mnngpu.demo import demo_model_dir

    model = llm.create(str(demo_model_dir() / "config.json"))
    model.set_config({"sampler_type": "greedy", "thread_num": 2})
    model.load()
    want = model.generate(model.tokenizer_encode("Once upon a time"), max_new_tokens=12)

    cold = _run("wait", tmp_path)
    assert cold["standins"] > 0 and cold["pending"]      # it did start on the twins
    assert "compiling kernels in the background" in cold["stderr"]
    assert cold["tokens"] == want                        # ... and they gave the compiled kernels' tokens
    assert cold["all_compiled"] and cold["tokens_after"] == want
    assert any(tmp_path.glob("kernels-*/tokenizer_*/tokenizer-*.warm"))   # beside this install's tokenizer kernels

    warm = _run("once", tmp_path)
    assert warm["standins"] == 0 and not warm["pending"]
    assert "compiling" not in warm["stderr"]
    assert warm["misses"] == []                          # every kernel came from the cache
    assert warm["tokens"] == want


def _background_workers(cache) -> list[str]:
    """The background compile processes (python -m mnngpu.jit) filling this cache folder."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        setting = f"NUMBA_CACHE_DIR={cache}".encode()   # the child's is this version's folder inside it
        if b"mnngpu.jit" in command and any(entry.startswith(setting) for entry in environment):
            found.append(pid)
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc to find the background process")
def test_a_short_first_run_still_leaves_a_warm_cache(tmp_path):
    """A run that ends before its kernels are compiled (the usual first `mnngpu run`) hands them
    to a background process at exit; the run after that compiles nothing."""
    short = _run("once", tmp_path)
    assert short["standins"] > 0
    deadline = time.monotonic() + 900      # a bound on the wait, not a speed check
    while _background_workers(tmp_path) and time.monotonic() < deadline:
        time.sleep(1)
    assert not _background_workers(tmp_path)
    after = _run("once", tmp_path)
    assert after["standins"] == 0 and after["misses"] == []
    assert after["tokens"] == short["tokens"]


def test_type_key_separates_exactly_what_numba_types_separate():
    """runnable's cache key: two arguments share a key only if numba gives them the same type."""
    base = np.zeros((4, 6), np.float32)
    readonly = base.copy()
    readonly.flags.writeable = False
    samples = [base, base.T, base[:, ::2], base[0], readonly, base.astype(np.float64), base.astype(np.int8),
               np.broadcast_to(np.float32(1), (4, 6)), np.zeros(3, np.float32), (base, base), (base, base[0]),
               (base, 3), 3, 2 ** 63, 2.5, True, np.float32(1), np.int64(2), np.uint64(2)]
    keys = [jit._type_key(sample) for sample in samples]
    assert None not in keys
    types_ = [numba.typeof(sample) for sample in samples]
    for i, (key, type_) in enumerate(zip(keys, types_)):
        for other_key, other_type in zip(keys[i + 1:], types_[i + 1:]):
            assert (key == other_key) <= (type_ == other_type), (key, type_, other_type)
    assert len(set(keys)) >= len(set(types_))


def test_router_kernels_and_twins_match_the_host_rules():
    """The CPU's router ops (backends/cpu/ops/routing.py: CPURouterOp) against the host rules of
    mnngpu/ops/routing.py: softmax, the top k (ties: the lower index first) and a row sum."""
    from types import SimpleNamespace

    from mnngpu.backends.cpu.ops import routing as cpu_routing
    from mnngpu.ops import routing as rules

    rng = np.random.default_rng(RNG_SEED)
    x = rng.normal(size=(3, 32)).astype(np.float32)
    x[1, 5] = x[1, 9] = x[1, 20] = x[1].max() + 1   # a three-way tie for the top
    want_soft = rules.softmax(SimpleNamespace(param=None), [x])
    for largest in (True, False):
        want_values, want_ids = rules.top_k(SimpleNamespace(param=SimpleNamespace(largest=largest)),
                                            [x, np.array([4], np.int32)])
        for kernel in (cpu_routing.top_k_rows, jit.TWINS[cpu_routing.top_k_rows]):
            values, ids = np.empty((3, 4), np.float32), np.empty((3, 4), np.int32)
            kernel(x, largest, values, ids)
            assert np.array_equal(ids, want_ids) and np.array_equal(values, want_values)
    for kernel in (cpu_routing.softmax_rows, jit.TWINS[cpu_routing.softmax_rows]):
        got = np.empty_like(x)
        kernel(x, got)
        reference.assert_close(got, want_soft, 1e-6)
    rows = want_soft[:, :4].copy()
    want_sum = rules.reduction(SimpleNamespace(param=SimpleNamespace(operation="SUM", keepDims=False, dim=[1])),
                               [rows])
    for kernel in (cpu_routing.sum_rows, jit.TWINS[cpu_routing.sum_rows]):
        got = np.empty(3, np.float32)
        kernel(rows, got)
        assert np.array_equal(got, want_sum)
