"""The CPU backend's GELU kernel (backends/cpu/kernels/fastmath.gelu_tanh) against the tanh formula in
numpy (float64), over the range activations take and past exp's clamp."""

from __future__ import annotations

import numpy as np

from mnngpu.backends.cpu.kernels.fastmath import gelu_tanh


def test_gelu_tanh_matches_the_formula():
    x = np.concatenate([np.linspace(-12, 12, 4001), [-200.0, -90.0, 90.0, 200.0, 0.0]]).astype(np.float32)
    out = np.empty_like(x)
    gelu_tanh(x, out)
    wide = x.astype(np.float64)
    truth = 0.5 * wide * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (wide + 0.044715 * wide ** 3)))
    np.testing.assert_allclose(out, truth, rtol=2e-4, atol=1e-6)
