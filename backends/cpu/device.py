"""The CPU backend's device is its threads: numba's pool for the decode kernels, a small worker pool
for prefill.

Prefill splits each big op into independent tiles (dequantize + a BLAS multiply, or one KV
head of attention) and runs them on `thread_num` Python threads; the kernels release the GIL.
BLAS itself is kept to one thread, so its spinning workers never compete with these.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

import numba

# numpy's bundled OpenBLAS names its setter after the wheel's symbol suffix.
_BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                 "openblas_set_num_threads64_", "openblas_set_num_threads")


def set_blas_threads(count: int) -> bool:
    """Set the thread count of the OpenBLAS that numpy loaded; False when none is found."""
    import numpy.linalg  # noqa: F401  (loads the BLAS library)

    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
    except OSError:
        return False
    for path in sorted(paths):
        if not os.path.exists(path):
            continue
        library = ctypes.CDLL(path)
        for name in _BLAS_SETTERS:
            setter = getattr(library, name, None)
            if setter is not None:
                setter(ctypes.c_int(count))
                return True
    return False


class WorkerPool:
    """`parallel(fn, n)` runs fn(0..n-1) on the calling thread plus `threads - 1` workers; each thread
    takes the next index when it is done with one, so tiles of unequal cost still balance (give
    the costly ones the low indices).

    An exception in the calling thread (Ctrl-C, say, while a worker compiles a kernel) returns at
    once: no new index is handed out, and the next `parallel` first waits for the tiles still
    running, so they never write into buffers a later op uses."""

    _shared: dict[int, WorkerPool] = {}

    def __init__(self, threads: int):
        self.threads = max(1, threads)
        self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="mnngpu-cpu") if self.threads > 1 else None
        self._abandoned: list[Future] = []

    @classmethod
    def shared(cls, threads: int) -> WorkerPool:
        """One pool per thread count for the whole process, however many backends are made."""
        threads = max(1, threads)
        if threads not in cls._shared:
            cls._shared[threads] = cls(threads)
        return cls._shared[threads]

    def parallel(self, fn: Callable[[int], None], count: int) -> None:
        if self._pool is None or count <= 1:
            for index in range(count):
                fn(index)
            return
        if self._abandoned:
            wait(self._abandoned)
            self._abandoned = []
        indices = iter(range(count))
        lock = threading.Lock()
        stopped = threading.Event()

        def drain() -> None:
            while not stopped.is_set():
                with lock:
                    index = next(indices, None)
                if index is None:
                    return
                fn(index)

        futures = [self._pool.submit(drain) for _ in range(min(self.threads, count) - 1)]
        try:
            drain()
            for future in futures:
                future.result()
        except BaseException:
            stopped.set()
            self._abandoned = futures
            raise


def launch_is_cheap() -> bool:
    """Whether numba's threading layer starts a parallel kernel in microseconds (OpenMP, TBB) rather
    than in a tenth of a millisecond (workqueue); numba picks the layer when it starts its thread
    pool, which asking its thread count does (no kernel compiled)."""
    numba.get_num_threads()
    return numba.threading_layer() != "workqueue"
