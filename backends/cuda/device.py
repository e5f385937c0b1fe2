"""The CUDA device through cupy: the availability check, the stream, and compiled kernels.

cupy is imported only here, when a CUDABackend is constructed, so `import mnngpu.backends.cuda`
works on a machine without it and the constructor can say what to install.

Kernel sources are shaders/cuda/*.cu; `#include "x.cuh"` lines are inlined before compiling
so that cupy's on-disk cache (keyed by the source text) sees every change. Each file is built
once per storage type (STORAGE=0/1/2) with NVRTC; cupy caches the binaries under
$CUPY_CACHE_DIR, which defaults here to $XDG_CACHE_HOME/mnngpu/cupy.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnngpu.backend import warn_once
from mnngpu.backends.cuda import cublas
from mnngpu.backends.cuda.cublas import CublasGemm
from mnngpu.errors import BackendUnavailableError
from mnngpu.shaders import shader_path

log = logging.getLogger("mnngpu.cuda")

INSTALL_HINT = ("install cupy for your CUDA driver (pip install 'mnngpu[cuda]' gives cupy-cuda13x; "
                "use cupy-cuda12x with a CUDA 12 driver) on a machine with an NVIDIA GPU")
BLOCK = 256            # threads per block of the elementwise launches
MAX_GRID = 65535       # blocks of a 1-D grid-stride launch
_INCLUDE = re.compile(r'^#include "([\w.]+)"\s*$', re.MULTILINE)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mnngpu" / "cupy"


def import_cupy() -> Any:
    """The cupy module with at least one usable CUDA device, or BackendUnavailableError."""
    os.environ.setdefault("CUPY_CACHE_DIR", str(default_cache_dir()))
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken install failing inside its own import
        raise BackendUnavailableError(f"the cuda backend needs cupy, which could not be imported ({exc}); "
                                      f"{INSTALL_HINT}", field="backend_type") from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # cupy's CUDARuntimeError, or a missing libcudart
        raise BackendUnavailableError(f"cupy {cupy.__version__} found no usable CUDA driver or device ({exc}); "
                                      f"{INSTALL_HINT}", field="backend_type") from exc
    if count == 0:
        raise BackendUnavailableError(f"cupy {cupy.__version__} sees no CUDA device; {INSTALL_HINT}",
                                      field="backend_type")
    return cupy


def kernel_source(name: str) -> str:
    """shaders/cuda/<name> with its `#include "..."` lines replaced by the included files."""
    text = shader_path("cuda", name).read_text()
    return _INCLUDE.sub(lambda m: shader_path("cuda", m.group(1)).read_text(), text)


def grid_for(n: int) -> tuple[int]:
    """A 1-D grid for a grid-stride loop over n elements."""
    return (max(1, min(MAX_GRID, -(-int(n) // BLOCK))),)


@dataclass
class Launch:
    """One prepared kernel launch: everything fixed at resize, replayed every step."""

    kernel: Any
    grid: tuple[int, ...]
    block: tuple[int, ...]
    args: tuple


class CudaDevice:
    """GPU 0, one non-blocking stream (graph capture cannot use the legacy default stream),
    and the kernel modules built for one storage type."""

    def __init__(self, storage_define: int):
        self.cp = import_cupy()
        self.storage_define = storage_define
        self.stream = self.cp.cuda.Stream(non_blocking=True)
        self._modules: dict[str, Any] = {}
        self._kernels: dict[tuple[str, str], Any] = {}
        props = self.cp.cuda.runtime.getDeviceProperties(0)
        name = props.get("name", b"?")
        self.name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        self.compute_capability = f"{props.get('major', '?')}.{props.get('minor', '?')}"

    def kernel(self, source: str, name: str) -> Any:
        """Kernel `name` of shaders/cuda/<source>, compiled on first use."""
        key = (source, name)
        if key not in self._kernels:
            if source not in self._modules:
                self._modules[source] = self.cp.RawModule(
                    code=kernel_source(source), options=("-std=c++17", f"-DSTORAGE={self.storage_define}"))
            self._kernels[key] = self._modules[source].get_function(name)
        return self._kernels[key]

    def run(self, launch: Launch) -> None:
        with self.stream:
            launch.kernel(launch.grid, launch.block, launch.args)

    def to_device(self, array) -> Any:
        """A device copy of a host array (weights, index maps), made on the backend's stream."""
        with self.stream:
            return self.cp.asarray(array)

    def empty(self, size: int, dtype) -> Any:
        """A flat device array of at least one element (kernels may not take empty buffers)."""
        with self.stream:
            return self.cp.empty(max(1, int(size)), dtype=dtype)

    def synchronize(self) -> None:
        self.stream.synchronize()

    @property
    def cublas(self) -> CublasGemm | None:
        """The capturable prefill GEMM (backends/cuda/cublas.py), or None where it cannot be had."""
        if not hasattr(self, "_cublas"):
            self._cublas, reason = cublas.load(self.cp, self.stream)
            if self._cublas is None:
                warn_once(f"CUDA prefill GEMMs run outside CUDA graphs, one launch per op: {reason}")
        return self._cublas
