"""The OpenCL device: platform and device choice, the context, and built programs.

One context per device is shared by every OpenCLBackend in the process, so programs are
built once. Built binaries are cached on disk outside the model folder: PoCL and NVIDIA cache
source builds themselves (PoCL under $XDG_CACHE_HOME/pocl), and pyopencl caches the others'
binaries under $XDG_CACHE_HOME/pyopencl.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pyopencl as cl

from mnngpu.errors import BackendUnavailableError
from mnngpu.shaders import shader_path

log = logging.getLogger("mnngpu.opencl")

INSTALL_HINT = ("install an ICD such as pocl-opencl-icd (Debian) or your GPU vendor's driver, "
                "and pip install 'mnngpu[opencl]'")

# Kernel families: "gpu" stages tiles in local memory behind barriers; "cpu" keeps work in
# registers, because PoCL runs barrier-heavy local-memory kernels many times slower.
VARIANTS = ("cpu", "gpu")

def _pick_device() -> cl.Device:
    """A GPU if there is one, else an accelerator, else a CPU device."""
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        raise BackendUnavailableError(f"no OpenCL platform found: {INSTALL_HINT}", field="backend_type") from exc
    devices = []
    for platform in platforms:
        try:
            devices.extend(platform.get_devices())
        except cl.Error:
            continue  # a platform with no device of its own
    if not devices:
        names = ", ".join(p.name for p in platforms) or "none"
        raise BackendUnavailableError(f"no OpenCL device found (platforms: {names}): {INSTALL_HINT}",
                                      field="backend_type")
    order = (cl.device_type.GPU, cl.device_type.ACCELERATOR, cl.device_type.CPU)
    return min(devices, key=lambda d: next((i for i, t in enumerate(order) if d.type & t), len(order)))


@dataclass(eq=False)
class OpenCLDevice:
    device: cl.Device
    context: cl.Context
    programs: dict[tuple, cl.Program] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.device.name} ({self.device.platform.name})"

    @property
    def is_cpu(self) -> bool:
        return bool(self.device.type & cl.device_type.CPU)

    @property
    def has_fp16(self) -> bool:
        return "cl_khr_fp16" in self.device.extensions.split()

    @property
    def default_variant(self) -> str:
        return "cpu" if self.is_cpu else "gpu"

    def buffer(self, nbytes: int) -> cl.Buffer:
        return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(int(nbytes), 4))

    def constant(self, array: np.ndarray) -> cl.Buffer:
        """A read-only buffer holding `array` (at least 4 bytes, as OpenCL wants no empty buffer)."""
        data = np.ascontiguousarray(array)
        if data.nbytes == 0:
            data = np.zeros(1, dtype=np.float32)
        return cl.Buffer(self.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)

    def program(self, source: str, defines: dict[str, object]) -> cl.Program:
        """shaders/opencl/<source> built with `defines` behind the shared storage header."""
        key = (source, tuple(sorted(defines.items())))
        if key not in self.programs:
            header = "".join(f"#define {name} {value}\n" for name, value in sorted(defines.items()))
            text = header + shader_path("opencl", "common.cl").read_text() + shader_path("opencl", source).read_text()
            self.programs[key] = cl.Program(self.context, text).build()
        return self.programs[key]


_shared: OpenCLDevice | None = None


def shared_device() -> OpenCLDevice:
    """The process's OpenCL device; raises BackendUnavailableError when there is none."""
    global _shared
    if _shared is None:
        device = _pick_device()
        _shared = OpenCLDevice(device, cl.Context([device]))
    return _shared
