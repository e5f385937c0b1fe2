"""The prefill GEMM through cuBLAS in a form a CUDA graph can capture.

cupy's cuBLAS wrappers point the handle at the current stream before every call, and refuse to
while that stream is capturing (cupy 14.2: "calling cuBLAS API during stream capture is
currently unsupported"), although cuBLAS itself can be captured. So `CublasGemm` calls
cublasGemmEx through ctypes, on a handle of its own that is bound to the backend's stream once,
when it is made: cupy's handle is shared by every backend of the process, each with its own
stream, and a capture must never find it pointing at another backend's. The library is the
libcublas cupy already loaded. Where it cannot be found, `load` says why and returns None, and
the GEMMs stay with cupy.matmul, outside the graph.
"""

from __future__ import annotations

import ctypes
import weakref
from pathlib import Path
from typing import Any

OP_N, OP_T = 0, 1
DATA_TYPES = {"float32": 0, "float16": 2}   # cudaDataType_t: CUDA_R_32F, CUDA_R_16F
COMPUTE_32F = 68                            # cublasComputeType_t: fp32 accumulation
GEMM_DEFAULT = -1                           # cublasGemmAlgo_t


class CublasError(RuntimeError):
    pass


def loaded_library_path(maps: Path = Path("/proc/self/maps")) -> str | None:
    """The path of the libcublas (not libcublasLt) this process has mapped, if any."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return None
    for fields in (line.split() for line in lines):
        if fields and Path(fields[-1]).name.startswith("libcublas.so"):
            return fields[-1]
    return None


class CublasGemm:
    def __init__(self, library: Any, stream: Any):
        self.library, self.stream = library, stream
        self.handle = ctypes.c_void_p()
        self._check(_function(library, "cublasCreate")(ctypes.byref(self.handle)), "cublasCreate")
        # destroyed with its backend, not at exit, when the CUDA context may already be gone
        weakref.finalize(self, _function(library, "cublasDestroy"), self.handle).atexit = False
        self._check(_function(library, "cublasSetStream")(self.handle, ctypes.c_void_p(stream.ptr)),
                    "cublasSetStream")
        self.gemm_ex = library.cublasGemmEx
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def rows_times_weights(self, x: Any, weights: Any, rows: int, count: int, ic: int, out: Any, column: int,
                           width: int) -> None:
        """out[r, column + c] = sum_i x[r, i] * weights[c, i] for r < rows, c < count, where x is
        [rows, ic], weights [count, ic] and out [rows, width], all row-major of one float dtype."""
        kind = DATA_TYPES[str(x.dtype)]
        c = ctypes.c_void_p(out.data.ptr + column * out.dtype.itemsize)
        # Column-major, out^T [count, rows] = weights [count, ic] @ x^T [ic, rows]: weights is
        # read transposed from its column-major [ic, count] view, x^T is x's own memory.
        status = self.gemm_ex(self.handle, OP_T, OP_N, count, rows, ic, ctypes.byref(self.one),
                              ctypes.c_void_p(weights.data.ptr), kind, ic, ctypes.c_void_p(x.data.ptr), kind, ic,
                              ctypes.byref(self.zero), c, kind, width, COMPUTE_32F, GEMM_DEFAULT)
        self._check(status, "cublasGemmEx")

    @staticmethod
    def _check(status: int, call: str) -> None:
        if status != 0:
            raise CublasError(f"{call} returned cuBLAS status {status}")


def _function(library: Any, name: str) -> Any:
    """cuBLAS's v2 entry point (cublasCreate_v2, ...) where the library has one."""
    return getattr(library, f"{name}_v2", None) or getattr(library, name)


def load(cp: Any, stream: Any) -> tuple[CublasGemm | None, str]:
    """A CublasGemm bound to `stream`, or None and the reason."""
    try:
        cp.cuda.device.get_cublas_handle()   # cupy loads libcublas on first use
    except Exception as exc:  # noqa: BLE001 (any failure leaves the GEMMs with cupy)
        return None, f"cupy gave no cuBLAS handle ({type(exc).__name__}: {exc})"
    path = loaded_library_path()
    if path is None:
        return None, "the libcublas cupy loaded was not found in /proc/self/maps"
    try:
        return CublasGemm(ctypes.CDLL(path), stream), ""
    except (OSError, AttributeError, CublasError) as exc:
        return None, f"{path}: {exc}"
