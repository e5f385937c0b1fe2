"""NVRTC, NVIDIA's runtime CUDA compiler, from the `nvidia-cuda-nvrtc` wheel through ctypes: it compiles
CUDA C++ to PTX with no GPU and no driver, so the test extra can check the kernels on any Linux x86-64
machine (tests/test_cuda_kernels_compile.py)."""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

WHEEL = "nvidia-cuda-nvrtc"


class NvrtcUnavailable(RuntimeError):
    pass


class NvrtcError(RuntimeError):
    pass


def _library_path() -> Path:
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
    found = sorted(p for root in roots for p in Path(root).glob("*/lib/libnvrtc.so*") if "builtins" not in p.name)
    if not found:
        raise NvrtcUnavailable(f"no libnvrtc.so: the {WHEEL} wheel is not installed (pip install {WHEEL})")
    return found[-1]


def load() -> ctypes.CDLL:
    """The wheel's libnvrtc; NvrtcUnavailable saying why when it cannot be loaded here."""
    path = _library_path()
    try:
        return ctypes.CDLL(str(path))
    except OSError as exc:
        raise NvrtcUnavailable(f"{path.name} does not load on this machine: {exc}") from exc


def version(lib: ctypes.CDLL) -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def _text(lib, program, size_call, read_call) -> str:
    size = ctypes.c_size_t()
    size_call(program, ctypes.byref(size))
    buffer = ctypes.create_string_buffer(size.value)
    read_call(program, buffer)
    return buffer.value.decode(errors="replace")


def compile_ptx(lib: ctypes.CDLL, source: str, name: str, options: list[str]) -> str:
    """source compiled to PTX; NvrtcError holding NVRTC's log when it does not compile."""
    program = ctypes.c_void_p()
    status = lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None)
    if status != 0:
        raise NvrtcError(f"nvrtcCreateProgram failed for {name} (status {status})")
    try:
        argv = (ctypes.c_char_p * len(options))(*(option.encode() for option in options))
        status = lib.nvrtcCompileProgram(program, len(options), argv)
        if status != 0:
            log = _text(lib, program, lib.nvrtcGetProgramLogSize, lib.nvrtcGetProgramLog)
            raise NvrtcError(f"{name} does not compile (NVRTC status {status}):\n{log}")
        return _text(lib, program, lib.nvrtcGetPTXSize, lib.nvrtcGetPTX)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))
