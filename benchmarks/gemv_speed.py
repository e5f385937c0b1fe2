"""Read bandwidth of the CPU's quantized GEMV kernels on the 0.5B model's matrix shapes.

    python -m benchmarks.gemv_speed [--threads 2] [--rows 1 4] [--precision low normal]

Each shape is an int4 matrix, block 64, with random codes and (min, scale) pairs laid out as the
weight file lays them (precision low: repacked into lane groups, as the CPU backend does at
load; normal: the float GEMVs), several copies of it so that every call reads from memory and not
from cache. It prints the GB/s each kernel reads (codes + alpha bytes over the time of a call), for the
best call and for the mean of all calls, next to the machine's read bandwidth (machine.py), and
the time per call in microseconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("MNNGPU_BACKGROUND_COMPILE", "0")

from benchmarks.machine import cpu_description, read_bandwidth_gbs
from mnngpu.backends.cpu.kernels import lane_kernels
from mnngpu.backends.cpu.kernels import linear_kernels as kernels

BLOCK = 64
COPIES_BYTES = 512 << 20   # how much weight memory the copies of one shape span
SHAPES = {   # name: (member output sizes, input size)
    "qkv": ((896, 128, 128), 896),
    "o": ((896,), 896),
    "gate+up": ((4864, 4864), 896),
    "down": ((896,), 4864),
    "lm_head": ((151936,), 896),
}


def matrix(rng, oc: int, ic: int):
    codes = rng.integers(0, 256, size=(oc, ic // 2), dtype=np.uint8)
    alpha = np.stack([rng.standard_normal((oc, ic // BLOCK)) * 0.01,
                      rng.random((oc, ic // BLOCK)) * 0.002 + 1e-4], axis=-1).astype(np.float32)
    return codes, alpha


def call_args(rng, outs: tuple, ic: int, rows: int, quantized: bool, gated: bool) -> tuple:
    """One call's arguments: precision low's lane-group kernels (quantized), else the float GEMVs."""
    members = [matrix(rng, oc, ic) for oc in outs]
    if quantized:
        members = [lane_kernels.pack(codes, alpha) for codes, alpha in members]
    codes_t, alpha_t = tuple(m[0] for m in members), tuple(m[1] for m in members)
    k_t = tuple(np.float32(-8) for _ in outs)
    bias_t = tuple(np.zeros(0, dtype=np.float32) for _ in outs)
    xs = rng.standard_normal((rows, ic)).astype(np.float32)
    spans = kernels.row_spans(list(outs))
    out_t = tuple(np.empty((rows, oc), np.float32) for oc in outs)
    out = np.empty((rows, outs[0]), np.float32)   # a gated call's up * silu(gate)
    if quantized:
        group = (codes_t, alpha_t, k_t, bias_t, spans, xs, BLOCK, *lane_kernels.x_buffers(rows, ic, BLOCK), out_t)
        return (*group, out) if gated else group
    one = rows == 1
    buffers = kernels.row_buffers(rows, ic, BLOCK)
    group = (codes_t, alpha_t, k_t, bias_t, spans, xs[0] if one else xs, True, BLOCK,
             *(tuple(b[0] for b in buffers) if one else buffers), tuple(o[0] for o in out_t) if one else out_t)
    return (*group, out[0] if one else out) if gated else group


def read_bytes(args: tuple) -> int:
    """The weight bytes one call reads: every member's codes and (min, scale) pairs as the kernel
    holds them (precision low keeps the pairs in float16)."""
    codes_t, alpha_t = args[0], args[1]
    return sum(codes.nbytes + alpha.nbytes for codes, alpha in zip(codes_t, alpha_t))


def kernel_for(rows: int, gated: bool, quantized: bool):
    if quantized:
        return lane_kernels.lanes_gated if gated else lane_kernels.lanes_group
    if gated:
        return kernels.gemv_gated if rows == 1 else kernels.gemv_rows_gated
    return kernels.gemv_group if rows == 1 else kernels.gemv_rows_group


def call_seconds(kernel, copies: list, repeats: int) -> tuple[float, float]:
    """The best and the mean time of one call, each call on the next copy."""
    kernel(*copies[0])
    times = []
    for _ in range(repeats):
        for args in copies:
            start = time.perf_counter()
            kernel(*args)
            times.append(time.perf_counter() - start)
    return min(times), sum(times) / len(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--precision", nargs="+", default=["low"], choices=["low", "normal"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import numba
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(cpu_description())
    print(f"read bandwidth {read_bandwidth_gbs(args.threads):.1f} GB/s; threads {args.threads}")
    print(f"{'shape':10s} {'rows':>4s} {'precision':>9s} {'us/call':>9s} {'GB/s':>7s} {'mean us':>9s} {'mean GB/s':>9s}")
    for name, (outs, ic) in SHAPES.items():
        gated = name == "gate+up"
        file_bytes = sum(oc * ic // 2 + oc * ic // BLOCK * 8 for oc in outs)
        n_copies = max(2, COPIES_BYTES // file_bytes)
        for precision in args.precision:
            for rows in args.rows:
                copies = [call_args(rng, outs, ic, rows, precision == "low", gated) for _ in range(n_copies)]
                weight_bytes = read_bytes(copies[0])
                best, mean = call_seconds(kernel_for(rows, gated, precision == "low"), copies, args.repeats)
                print(f"{name:10s} {rows:4d} {precision:>9s} {best * 1e6:9.1f} {weight_bytes / best / 1e9:7.2f}"
                      f" {mean * 1e6:9.1f} {weight_bytes / mean / 1e9:9.2f}")
                del copies
    return 0


if __name__ == "__main__":
    sys.exit(main())
