"""A stand-in for the part of cupy the CUDA backend uses, so that its host side runs on a machine
without a GPU (tests/backend/test_cuda_offline.py): device arrays are numpy arrays, a stream runs
each launch at once, or records it while capturing for the graph to replay, and every launch is
checked against its kernel's signature in the source the backend compiles (shaders/cuda): the
argument count, numpy int32 / float32 scalars for int / float parameters, an array of the element
size each pointer parameter reads, and the grid and block limits.

Only the KV-cache kernels compute (KV_KERNELS: numpy written from shaders/cuda/attention.cu,
float32 storage), so that sequences, slots, the rows table and the graphs' replay can be checked
against the reference attention; every other kernel checks its launch and leaves its output as it
was. This checks the host side only: the CUDA kernels themselves run in tests/test_cuda_kernels_compile.py
(compiled) and under a GPU (tests/backend/test_cuda_ops.py, test_batch_cuda.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

_KERNEL = re.compile(r'extern "C" __global__ void (\w+)\(([^)]*)\)', re.DOTALL)
IDLE_SLOT = -1
MAX_BLOCK_THREADS = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)


class FakeArray(np.ndarray):
    """A device array: numpy, with cupy's host transfers."""

    def set(self, values, stream=None) -> None:
        _no_transfer_while_capturing("ndarray.set")
        self[...] = np.asarray(values).reshape(self.shape)

    def get(self, stream=None) -> np.ndarray:
        _no_transfer_while_capturing("ndarray.get")
        return np.array(self, copy=True).view(np.ndarray)


def _device(array: np.ndarray) -> FakeArray:
    return np.ascontiguousarray(array).view(FakeArray)


@dataclass
class Parameter:
    kind: str     # "int", "float" or "pointer"
    itemsize: int  # of a pointer's element; 0 for a scalar
    text: str


def parameters(declaration: str, storage_itemsize: int, gemm_itemsize: int) -> list[Parameter]:
    sizes = {"real_t": storage_itemsize, "gemm_t": gemm_itemsize, "float": 4, "int": 4, "unsigned int": 4,
             "short": 2, "unsigned short": 2, "char": 1, "unsigned char": 1}
    found = []
    for text in (part.strip() for part in declaration.split(",")):
        words = text.replace("*", " * ").split()
        if "*" in words:
            element = " ".join(w for w in words[: words.index("*")] if w != "const")
            found.append(Parameter("pointer", sizes[element], text))
        else:
            found.append(Parameter(" ".join(words[:-1]), 0, text))
    return found


class Stream:
    capturing: Stream | None = None   # the stream now recording its launches (one at a time here)

    def __init__(self, non_blocking: bool = False):
        self.ptr = id(self)
        self.recorded: list | None = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self) -> None:
        _no_transfer_while_capturing("stream.synchronize")

    def begin_capture(self) -> None:
        self.recorded = []
        Stream.capturing = self

    def end_capture(self) -> Graph:
        launches, self.recorded = self.recorded, None
        Stream.capturing = None
        return Graph(launches)


class Graph:
    def __init__(self, launches: list):
        self.launches = launches
        self.replays = 0

    def launch(self, stream=None) -> None:
        self.replays += 1
        for kernel, args in self.launches:
            kernel.compute(*args)


def _no_transfer_while_capturing(what: str) -> None:
    if Stream.capturing is not None:
        raise RuntimeError(f"{what} during a CUDA graph capture")


class Kernel:
    def __init__(self, name: str, params: list[Parameter], storage_itemsize: int):
        self.name, self.params, self.storage_itemsize = name, params, storage_itemsize
        self.launches = 0

    def __call__(self, grid, block, args) -> None:
        self.check(tuple(grid), tuple(block), tuple(args))
        self.launches += 1
        if Stream.capturing is not None:
            Stream.capturing.recorded.append((self, (grid, block, args)))
        else:
            self.compute(grid, block, args)

    def check(self, grid: tuple, block: tuple, args: tuple) -> None:
        where = f"kernel {self.name}"
        if len(args) != len(self.params):
            raise TypeError(f"{where}: {len(args)} arguments for {len(self.params)} parameters")
        for index, (param, arg) in enumerate(zip(self.params, args)):
            if param.kind == "pointer":
                ok = isinstance(arg, FakeArray) and arg.dtype.itemsize == param.itemsize
            else:
                ok = type(arg) is {"int": np.int32, "float": np.float32}[param.kind]
            if not ok:
                raise TypeError(f"{where}: argument {index} ({param.text}) got {type(arg).__name__} "
                                f"{getattr(arg, 'dtype', '')}")
        if not all(isinstance(n, int) and n >= 1 for n in (*grid, *block)) or np.prod(block) > MAX_BLOCK_THREADS:
            raise ValueError(f"{where}: grid {grid}, block {block}")
        if any(n > limit for n, limit in zip(grid, MAX_GRID)):
            raise ValueError(f"{where}: grid {grid} over the limits {MAX_GRID}")

    def compute(self, grid, block, args) -> None:
        work = KV_KERNELS.get(self.name)
        if work is not None:
            if self.storage_itemsize != 4:
                raise NotImplementedError("the offline KV kernels compute float32 storage only")
            work(*args)


class RawModule:
    def __init__(self, code: str, options=()):
        define = next(o for o in options if o.startswith("-DSTORAGE="))
        storage = int(define.split("=")[1])
        storage_itemsize, gemm_itemsize = {0: (4, 4), 1: (2, 2), 2: (2, 4)}[storage]
        self.kernels = {name: Kernel(name, parameters(declaration, storage_itemsize, gemm_itemsize), storage_itemsize)
                        for name, declaration in _KERNEL.findall(code)}

    def get_function(self, name: str) -> Kernel:
        return self.kernels[name]


# ---- the KV-cache kernels, as shaders/cuda/attention.cu computes them ------------------------------------

def _place(s: int, batched, step, rows_table) -> tuple[int, int]:
    return (int(rows_table[2 * s]), int(rows_table[2 * s + 1])) if batched else (int(step[1]), int(step[0]) + s)


def kv_append(seq, kv_heads, head_dim, capacity, batched, step, rows_table, k_new, v_new, k_cache, v_cache):
    seq, kv_heads, head_dim, capacity = int(seq), int(kv_heads), int(head_dim), int(capacity)
    for new, cache in ((k_new, k_cache), (v_new, v_cache)):
        rows = new.reshape(-1)[: seq * kv_heads * head_dim].reshape(seq, kv_heads, head_dim)
        regions = cache.reshape(-1, kv_heads, capacity, head_dim)
        for s in range(seq):
            slot, position = _place(s, batched, step, rows_table)
            if slot != IDLE_SLOT and position < capacity:
                regions[slot, :, position] = rows[s]


def attention(seq, heads, kv_heads, head_dim, capacity, scale, window, batched, step, rows_table, q, k_cache,
              v_cache, out):
    seq, heads, kv_heads, head_dim, capacity = (int(x) for x in (seq, heads, kv_heads, head_dim, capacity))
    queries = q.reshape(-1)[: seq * heads * head_dim].reshape(seq, heads, head_dim).astype(np.float64)
    result = out.reshape(-1)[: seq * heads * head_dim].reshape(seq, heads, head_dim)
    keys, values = (c.reshape(-1, kv_heads, capacity, head_dim).astype(np.float64) for c in (k_cache, v_cache))
    for i in range(seq):
        slot, position = _place(i, batched, step, rows_table)
        if slot == IDLE_SLOT:
            result[i] = 0.0
            continue
        visible = min(position + 1, capacity)
        first = max(0, visible - int(window)) if window > 0 else 0
        for h in range(heads):
            g = h // (heads // kv_heads)
            scores = keys[slot, g, first:visible] @ queries[i, h] * float(scale)
            p = np.exp(scores - scores.max())
            result[i, h] = (p / p.sum()) @ values[slot, g, first:visible]


KV_KERNELS = {"kv_append": kv_append, "attention": attention}


def poisoned(size, dtype) -> np.ndarray:
    """What a fresh device allocation holds as far as a test can tell: garbage. Floats are NaN and
    integers their largest value, so a kernel that reads memory nothing wrote makes NaN logits or an
    out-of-range index instead of passing on zeros."""
    dtype = np.dtype(dtype)
    fill = np.nan if dtype.kind == "f" else np.iinfo(dtype).max if dtype.kind in "iu" else 0
    return np.full(size, fill, dtype=dtype)


def fake_cupy() -> SimpleNamespace:
    """The module the backend imports as cupy."""
    runtime = SimpleNamespace(getDeviceCount=lambda: 1,
                              getDeviceProperties=lambda index: {"name": b"offline stand-in", "major": 9, "minor": 0})

    def no_cublas():
        raise RuntimeError("no cuBLAS offline")

    return SimpleNamespace(
        __version__="offline", RawModule=RawModule, matmul=lambda a, b: _device(np.matmul(a, b)),
        asarray=lambda a: _device(np.asarray(a)),
        empty=lambda size, dtype: _device(poisoned(size, dtype)),
        zeros=lambda shape, dtype: _device(np.zeros(shape, dtype=dtype)),
        cuda=SimpleNamespace(runtime=runtime, Stream=Stream, device=SimpleNamespace(get_cublas_handle=no_cublas)))
