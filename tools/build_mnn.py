"""Build MNN from its source at one pinned commit, outside the repository: MNNConvert (the
converter that MNN's own llmexport.py at that commit calls with --mnnconvert) and libMNN.so with
the LLM engine and the transformer fusions (llm_demo links it), for exports in MNN's newer graph
format and references recorded by the runtime that reads them: tools/mnn_recorder.cpp is compiled
against it as WORKDIR/build-<commit>/mnn_recorder (the logits of a prefill and of each greedy step).

    python -m tools.build_mnn MNN_GIT_DIR WORKDIR [--jobs 2]

MNN_GIT_DIR is a clone of alibaba/MNN (a bare one will do) that holds MNN_COMMIT. Only the folders a
build reads are taken from it, file by file, so a copy without its large blobs works: apps/ (media)
is never read, and source/backend/vulkan is left out (its generated AllShader.cpp is such a blob;
the build does not need that backend). A blob missing elsewhere is an error naming it.

WORKDIR/src-<commit> holds the source, WORKDIR/build-<commit> the build; the binaries end in the
latter. A second run reuses both (ninja builds nothing when nothing changed). On 2 cores the
first build takes about 40 minutes; it runs under nice.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

MNN_COMMIT = "4d40bdbd7efb73a58383bb5da867a6f41eb1776e"   # HEAD of 2026-08-20: C4 fusion on by default
FOLDERS = ("3rd_party", "cmake", "codegen", "express", "include", "schema", "source", "tools", "transformers",
           "pymnn", "CMakeLists.txt")
LEFT_OUT = ("source/backend/vulkan/",)
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DMNN_BUILD_CONVERTER=ON", "-DMNN_BUILD_LLM=ON",
               "-DMNN_SUPPORT_TRANSFORMER_FUSE=ON", "-DMNN_LOW_MEMORY=ON",
               "-DMNN_CPU_WEIGHT_DEQUANT_GEMM=ON", "-DMNN_SEP_BUILD=OFF", "-DMNN_BUILD_TOOLS=OFF",
               "-DMNN_BUILD_SHARED_LIBS=ON", "-DMNN_AVX512=ON")
TARGETS = ("MNNConvert", "llm_demo")
RECORDER = Path(__file__).resolve().parent / "mnn_recorder.cpp"
DONE_MARK = ".exported"


def _git(git_dir: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True, **kwargs)


def _entries(git_dir: Path) -> list[tuple[str, str, str]]:
    """(mode, blob id, path) of every file the build reads, at MNN_COMMIT."""
    listing = _git(git_dir, "ls-tree", "-r", "-z", MNN_COMMIT, "--", *FOLDERS, capture_output=True).stdout
    entries = []
    for record in listing.decode().split("\0"):
        if not record:
            continue
        meta, path = record.split("\t", 1)
        mode, kind, blob = meta.split()
        if kind == "blob" and not path.startswith(LEFT_OUT):
            entries.append((mode, blob, path))
    return entries


def export_source(git_dir: Path, destination: Path) -> None:
    """The build's folders at MNN_COMMIT, written under `destination` (once)."""
    if (destination / DONE_MARK).is_file():
        return
    if destination.exists():
        shutil.rmtree(destination)
    entries = _entries(git_dir)
    reader = subprocess.Popen(["git", "--git-dir", str(git_dir), "cat-file", "--batch"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        for mode, blob, path in entries:
            reader.stdin.write(blob.encode() + b"\n")
            reader.stdin.flush()
            header = reader.stdout.readline().split()
            if header[-1] == b"missing":
                raise SystemExit(f"{path} (blob {blob}) is missing from {git_dir}: fetch it, or leave its "
                                 "folder out")
            data = reader.stdout.read(int(header[2]))
            reader.stdout.read(1)   # the newline after each object
            _write(destination / path, mode, data)
    finally:
        reader.stdin.close()
        reader.wait()
    (destination / DONE_MARK).write_text(MNN_COMMIT + "\n")
    print(f"exported {len(entries)} files of MNN {MNN_COMMIT[:9]} to {destination}")


def _write(target: Path, mode: str, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if mode == "120000":
        target.symlink_to(data.decode())
        return
    target.write_bytes(data)
    if mode == "100755":
        target.chmod(0o755)


def build(source: Path, build_dir: Path, jobs: int) -> None:
    """Configure once, then build TARGETS (ninja rebuilds only what changed)."""
    if not (build_dir / "build.ninja").is_file():
        launcher = ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"] \
            if shutil.which("ccache") else []
        subprocess.run(["cmake", "-S", str(source), "-B", str(build_dir), "-G", "Ninja", *CMAKE_FLAGS,
                        *launcher], check=True)
    subprocess.run(["nice", "-n", "10", "ninja", "-C", str(build_dir), "-j", str(jobs), *TARGETS], check=True)


def build_recorder(source: Path, build_dir: Path) -> Path:
    """tools/mnn_recorder.cpp linked against the libMNN.so just built (rebuilt when it is newer)."""
    recorder = build_dir / "mnn_recorder"
    library = build_dir / "libMNN.so"
    newest_input = max(RECORDER.stat().st_mtime, library.stat().st_mtime)
    if recorder.is_file() and recorder.stat().st_mtime > newest_input:
        return recorder
    subprocess.run(["g++", "-O2", "-std=c++17", str(RECORDER), "-I", str(source / "include"),
                    "-I", str(source / "transformers" / "llm" / "engine" / "include"), "-L", str(build_dir),
                    "-lMNN", f"-Wl,-rpath,{build_dir}", "-o", str(recorder)], check=True)
    return recorder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("git_dir", type=Path, help="a clone of alibaba/MNN holding the pinned commit")
    parser.add_argument("workdir", type=Path,
                        help="where the source and the build go (outside the repository)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    for tool in ("git", "cmake", "ninja"):
        if shutil.which(tool) is None:
            package = "ninja-build" if tool == "ninja" else tool
            parser.error(f"{tool} is not installed (Debian: apt-get install {package})")
    git_dir = args.git_dir / ".git" if (args.git_dir / ".git").is_dir() else args.git_dir
    workdir = args.workdir.resolve()
    source, build_dir = workdir / f"src-{MNN_COMMIT[:9]}", workdir / f"build-{MNN_COMMIT[:9]}"
    export_source(git_dir, source)
    build(source, build_dir, args.jobs)
    recorder = build_recorder(source, build_dir)
    print(f"built {', '.join(TARGETS)}, libMNN.so and {recorder.name} in {build_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
