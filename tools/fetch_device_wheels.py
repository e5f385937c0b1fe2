"""Fetch what benchmarks/device_check.sh needs on an offline NVIDIA machine into benchmarks/wheels/.

That machine (Python 3.12, torch, transformers, onnx, numba, cupy-cuda13x, ...) lacks mnn,
llmexport, pyopencl and vulkan. This downloads Python 3.12 manylinux wheels of those and of
every requirement they pull in that the machine's image does not already hold (DEVICE_HAS, its
package list), and, with --vulkan-loader, the Debian packages of the Vulkan/EGL loader that the
image lacks (into benchmarks/wheels/gl/). The folder is kept out of git via .git/info/exclude.

    python -m tools.fetch_device_wheels                 # wheels only
    python -m tools.fetch_device_wheels --vulkan-loader # and the loader .debs (needs apt-get)
    python -m tools.fetch_device_wheels --compact       # wheels over 8 MiB as .tar.xz of their files

--compact is for a transfer with a size limit: the mnn wheel's native libraries shrink from
17.6 to 10.1 MB under xz, and device_check.sh unpacks such a tarball into its --target folder,
which is what pip does with a wheel that has no scripts or data.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO / "benchmarks" / "wheels"
WANTED = ["mnn==3.6.1", "llmexport==0.0.5", "pyopencl", "vulkan", "onnxslim",
          "flatbuffers", "tokenizers", "jinja2", "sentencepiece"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
LOADER_DEBS = ["libvulkan1", "libegl1", "libglvnd0", "libopengl0", "libgl1", "libglx0", "libgles2"]
# The image's packages (the device notes' list, read 2026-11-17): never carried again.
DEVICE_PACKAGE_LIST = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec
patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server
tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3
uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
"""
DEVICE_HAS = {canonicalize_name(n) for n in DEVICE_PACKAGE_LIST.split()}
DEVICE_PYTHON = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
                 "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                 "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def download(spec: str, dest: Path) -> None:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
            "--implementation", "cp", *(arg for p in PLATFORMS for arg in ("--platform", p)), "-d", str(dest), spec]
    subprocess.run(argv, check=True)


def wheel_of(name: str, dest: Path) -> Path | None:
    key = canonicalize_name(name)
    for path in dest.glob("*.whl"):
        if canonicalize_name(path.name.split("-")[0]) == key:
            return path
    return None


def requirements(wheel: Path) -> list[Requirement]:
    """The wheel's unconditional run-time requirements on the device's Python."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode(errors="replace").splitlines()
    found = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or req.marker.evaluate({**DEVICE_PYTHON, "extra": ""}):
            found.append(req)
    return found


def fetch_wheels(dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    queue, seen = list(WANTED), set()
    while queue:
        spec = queue.pop(0)
        name = canonicalize_name(Requirement(spec).name)
        if name in seen:
            continue
        seen.add(name)
        if name in DEVICE_HAS:
            print(f"  {spec}: already on the device image, not carried")
            continue
        wheel = wheel_of(name, dest)
        if wheel is None:
            download(spec, dest)
            wheel = wheel_of(name, dest)
        if wheel is None:
            sys.exit(f"error: pip saved no wheel for {spec} in {dest}")
        print(f"  {spec}: {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB)")
        queue.extend(str(req) for req in requirements(wheel))
    return sorted(dest.glob("*.whl"))


COMPACT_OVER = 8 << 20


def compact(wheel: Path) -> Path | None:
    """The wheel's files as <wheel>.tar.xz in its place, or None for a wheel pip would do more
    with than unpack (scripts or data under *.data/)."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        if any(name.split("/")[0].endswith(".data") for name in names):
            return None
        packed = wheel.with_name(wheel.name + ".tar.xz")
        with tarfile.open(packed, "w:xz", preset=9) as tar:
            for info in archive.infolist():
                if info.is_dir():
                    continue
                entry = tarfile.TarInfo(info.filename)
                entry.size, entry.mode = info.file_size, (info.external_attr >> 16) or 0o644
                with archive.open(info) as data:
                    tar.addfile(entry, data)
    wheel.unlink()
    return packed


def fetch_loader_debs(dest: Path) -> None:
    """The Vulkan/EGL loader packages, as the device notes describe, for `dpkg -x` there."""
    dest.mkdir(parents=True, exist_ok=True)
    lists = Path("/tmp/amd64")
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    options = ["-oAPT::Architecture=amd64", "-oAPT::Architectures=amd64", f"-oDir::State::Lists={lists}"]
    subprocess.run(["apt-get", *options, "update"], check=True)
    subprocess.run(["apt-get", *options, "download", *LOADER_DEBS], check=True, cwd=dest)


def exclude_from_git(path: Path) -> None:
    exclude = REPO / ".git" / "info" / "exclude"
    if not exclude.parent.is_dir():
        return
    line = "/" + path.relative_to(REPO).as_posix() + "/"
    text = exclude.read_text() if exclude.exists() else ""
    if line not in text.splitlines():
        exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n") + line + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=DEFAULT_DIR, help=f"folder (default {DEFAULT_DIR})")
    parser.add_argument("--vulkan-loader", action="store_true", help="also fetch the loader .debs into DEST/gl")
    parser.add_argument("--compact", action="store_true",
                        help=f"store wheels over {COMPACT_OVER >> 20} MiB as .tar.xz of their files")
    args = parser.parse_args()
    dest = args.dest.resolve()
    if dest.is_relative_to(REPO):
        exclude_from_git(dest)
    wheels = fetch_wheels(dest)
    if args.compact:
        for wheel in [w for w in wheels if w.stat().st_size > COMPACT_OVER]:
            packed = compact(wheel)
            print(f"  {wheel.name}: " + (f"{packed.name} ({packed.stat().st_size / 1e6:.1f} MB)" if packed
                                          else "has scripts or data, kept as a wheel"))
        wheels = sorted(dest.glob("*.whl")) + sorted(dest.glob("*.tar.xz"))
    if args.vulkan_loader:
        fetch_loader_debs(dest / "gl")
    total = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"{len(wheels)} packages in {dest}, {total / 2**20:.1f} MiB in all")
    if total > 56 * 2**20:
        print("warning: a device call carries at most 64 MiB with the working tree; this leaves little room")


if __name__ == "__main__":
    main()
