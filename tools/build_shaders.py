"""Build the Vulkan kernels: shaders/vulkan/*.comp -> the shipped .spv files, plus a manifest.

One GLSL source gives one or more variants, each built with its own -D defines (FP16 storage,
weight kind, int tensors), as `shaders/vulkan/variants.toml` declares them;
`<source stem>_<variant>.spv` is what the backend loads.
`manifest.json` records, per .spv, a hash of everything that decides its bytes (the source,
the headers it includes, the defines and the flags) and the hash of the built file, so a
test can tell a stale or missing .spv without a shader compiler.

    python -m tools.build_shaders            # rebuild the variants whose inputs changed
    python -m tools.build_shaders --all      # rebuild every variant
    python -m tools.build_shaders --check    # exit 1 when a .spv is missing or stale
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from mnngpu import mapped_folders

SHADER_DIR = mapped_folders.folder("mnngpu.shaders") / "vulkan"
MANIFEST = SHADER_DIR / "manifest.json"
FLAGS = ["--target-env=vulkan1.1", "-O"]
# source stem -> {variant: defines}, declared beside the shaders; variant "" builds <stem>.spv
VARIANTS: dict[str, dict[str, list[str]]] = tomllib.loads((SHADER_DIR / "variants.toml").read_text())

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def spv_name(stem: str, variant: str) -> str:
    return f"{stem}_{variant}.spv" if variant else f"{stem}.spv"


def source_files(path: Path) -> list[Path]:
    """The source and every header it includes, recursively, in a fixed order."""
    seen: list[Path] = []
    pending = [path]
    while pending:
        current = pending.pop(0)
        if current in seen:
            continue
        seen.append(current)
        pending.extend(current.parent / name for name in INCLUDE.findall(current.read_text()))
    return seen


def inputs_hash(stem: str, defines: list[str]) -> str:
    """sha256 over the sources' bytes, the defines and the flags: what decides the .spv."""
    digest = hashlib.sha256()
    for path in source_files(SHADER_DIR / f"{stem}.comp"):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(json.dumps({"defines": defines, "flags": FLAGS}).encode())
    return digest.hexdigest()


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def glslc_version(glslc: str) -> str:
    out = subprocess.run([glslc, "--version"], check=True, capture_output=True, text=True).stdout
    return out.splitlines()[0].strip()


def compile_variant(glslc: str, stem: str, defines: list[str], out: Path) -> None:
    args = [glslc, *FLAGS, *(f"-D{d}" for d in defines), str(SHADER_DIR / f"{stem}.comp"), "-o", str(out)]
    result = subprocess.run(args, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"glslc failed on {stem}.comp {defines}:\n{result.stderr}")


def expected_entries() -> dict[str, dict]:
    """What the manifest must say for the current sources (without the built files' hashes)."""
    return {spv_name(stem, variant): {"source": f"{stem}.comp", "defines": defines,
                                      "inputs_sha256": inputs_hash(stem, defines)}
            for stem, variants in VARIANTS.items() for variant, defines in variants.items()}


def load_manifest() -> dict:
    return json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {"shaders": {}}


def stale(manifest: dict) -> list[str]:
    """Names of the .spv files that are missing, or not built from the current sources."""
    recorded = manifest.get("shaders", {})
    names = []
    for name, entry in expected_entries().items():
        have = recorded.get(name)
        path = SHADER_DIR / name
        if (have is None or have["inputs_sha256"] != entry["inputs_sha256"] or not path.exists()
                or file_hash(path) != have["spv_sha256"]):
            names.append(name)
    return names


def build(rebuild_all: bool) -> list[str]:
    glslc = shutil.which("glslc")
    if glslc is None:
        raise SystemExit("glslc not found: install shaderc (Debian: apt install glslc)")
    manifest = load_manifest()
    todo = set(expected_entries()) if rebuild_all else set(stale(manifest))
    entries = {}
    for name, entry in expected_entries().items():
        stem = entry["source"][: -len(".comp")]
        if name in todo:
            compile_variant(glslc, stem, entry["defines"], SHADER_DIR / name)
        entries[name] = {**entry, "spv_sha256": file_hash(SHADER_DIR / name)}
    for old in set(manifest.get("shaders", {})) - set(entries):
        (SHADER_DIR / old).unlink(missing_ok=True)
    manifest = {"flags": FLAGS, "glslc": glslc_version(glslc), "shaders": dict(sorted(entries.items()))}
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    return sorted(todo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="rebuild every variant")
    parser.add_argument("--check", action="store_true", help="only report stale or missing .spv files")
    args = parser.parse_args(argv)
    if args.check:
        names = stale(load_manifest())
        for name in names:
            print(f"stale: {name}")
        return 1 if names else 0
    for name in build(args.all):
        print(f"built {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
