"""The CUDA kernel sources compile for Hopper (sm_90) in every storage variant, and define
every kernel the backend launches. NVRTC from the `nvidia-cuda-nvrtc` wheel (the test extra
installs it) compiles every file with no GPU and no driver; nvcc builds PTX as the toolkit would,
and cupy's own NVRTC is checked where cupy is installed. Each check skips, saying so, when its
compiler is absent."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from mnngpu.backends.cuda.device import kernel_source
from mnngpu.shaders import shader_path
from tests import nvrtc_wheel
from tests.conftest import skip_unavailable

STORAGES = (0, 1, 2)   # fp32, fp16, bf16 (common.cuh)
KERNELS = {            # every kernel name backends/cuda launches, per source
    "elementwise.cu": {"binary_same", "binary_indexed", "unary", "int_to_real", "real_to_int"},
    "norm.cu": {"layer_norm"},
    "rope.cu": {"rope_rotate_half"},
    "linear.cu": {"gemv_q4", "gemv_q4_words", "gemv_q8", "gemv_q8_words", "gemv_dense", "dequant_q4",
                  "dequant_q8", "dense_to_gemm", "real_to_gemm", "gemm_to_real", "gemv_q4_tokens",
                  "gemv_q4_words_tokens", "gemv_q8_tokens", "gemv_q8_words_tokens", "gemv_dense_tokens"},
    "attention.cu": {"kv_append", "attention"},
    "copy.cu": {"gather_u32", "gather_u16", "scatter_u32", "scatter_u16"},
}


def entries(ptx: str) -> set[str]:
    return set(re.findall(r"\.entry\s+(\w+)\s*\(", ptx))


def test_every_shipped_source_is_checked():
    shipped = {p.name for p in shader_path("cuda", "").glob("*.cu")}
    assert shipped == set(KERNELS)


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("source", sorted(KERNELS))
def test_nvcc_builds_ptx_for_sm90(tmp_path, source, storage):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    src = tmp_path / source
    src.write_text(kernel_source(source))
    ptx = tmp_path / "out.ptx"
    done = subprocess.run([nvcc, "-ptx", "-arch=sm_90", "-std=c++17", f"-DSTORAGE={storage}", "-o", str(ptx),
                           str(src)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert KERNELS[source] <= entries(ptx.read_text())


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
        return nvrtc
    except Exception as exc:  # noqa: BLE001 (no cupy, or no libnvrtc beside it)
        skip_unavailable("cuda", f"cupy's NVRTC is not loadable: {exc}")


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("source", sorted(KERNELS))
def test_nvrtc_compiles_as_cupy_does(source, storage):
    nvrtc = _nvrtc()
    program = nvrtc.createProgram(kernel_source(source), source, (), ())
    try:
        nvrtc.compileProgram(program, ("-arch=compute_90", "-std=c++17", f"-DSTORAGE={storage}"))
    except Exception:  # noqa: BLE001 (NVRTC's error says less than its log)
        pytest.fail(nvrtc.getProgramLog(program))
    ptx = nvrtc.getPTX(program)
    assert KERNELS[source] <= entries(ptx.decode() if isinstance(ptx, bytes) else ptx)


@pytest.fixture(scope="module")
def wheel_nvrtc():
    try:
        return nvrtc_wheel.load()
    except nvrtc_wheel.NvrtcUnavailable as exc:
        pytest.skip(f"NVRTC from the {nvrtc_wheel.WHEEL} wheel is not loadable here: {exc}")


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("source", sorted(KERNELS))
def test_the_nvrtc_wheel_compiles_every_source(wheel_nvrtc, source, storage):
    ptx = nvrtc_wheel.compile_ptx(wheel_nvrtc, kernel_source(source), source,
                                  ["-arch=compute_90", "-std=c++17", f"-DSTORAGE={storage}"])
    assert KERNELS[source] <= entries(ptx)


def test_the_nvrtc_wheel_reports_a_source_that_does_not_compile(wheel_nvrtc):
    """The compile check can fail: a kernel with a type error is refused, with NVRTC's log."""
    broken = kernel_source("copy.cu") + '\nextern "C" __global__ void broken() { undeclared_type_t x; }\n'
    with pytest.raises(nvrtc_wheel.NvrtcError, match="undeclared_type_t"):
        nvrtc_wheel.compile_ptx(wheel_nvrtc, broken, "copy.cu", ["-arch=compute_90", "-std=c++17"])
