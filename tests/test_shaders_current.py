"""The shipped SPIR-V is built from the current GLSL: every .comp under shaders/vulkan has its
variants in manifest.json, with the hash of today's sources and flags and of the .spv on disk.
Where the same glslc as the manifest's is installed, a rebuild must give the same bytes."""

from __future__ import annotations

import shutil

from tests.conftest import skip_unavailable
from tools import build_shaders

SPIRV_MAGIC = bytes.fromhex("03022307")  # 0x07230203, little-endian


def test_every_comp_has_variants():
    sources = {p.stem for p in build_shaders.SHADER_DIR.glob("*.comp")}
    assert sources == set(build_shaders.VARIANTS)


def test_manifest_matches_sources_and_files():
    manifest = build_shaders.load_manifest()
    assert set(manifest["shaders"]) == set(build_shaders.expected_entries())
    assert manifest["flags"] == build_shaders.FLAGS
    assert build_shaders.stale(manifest) == [], "run python -m tools.build_shaders"


def test_spv_files_are_spirv():
    for name in build_shaders.expected_entries():
        assert (build_shaders.SHADER_DIR / name).read_bytes()[:4] == SPIRV_MAGIC, name


def test_editing_a_header_makes_its_users_stale(tmp_path, monkeypatch):
    """The hash covers included headers, so a change to common.glsl is seen as stale."""
    copy = tmp_path / "vulkan"
    shutil.copytree(build_shaders.SHADER_DIR, copy)
    monkeypatch.setattr(build_shaders, "SHADER_DIR", copy)
    monkeypatch.setattr(build_shaders, "MANIFEST", copy / "manifest.json")
    manifest = build_shaders.load_manifest()
    assert build_shaders.stale(manifest) == []
    (copy / "common.glsl").write_text((copy / "common.glsl").read_text() + "\n// edited\n")
    assert set(build_shaders.stale(manifest)) == set(build_shaders.expected_entries())


def test_rebuild_gives_the_same_bytes(tmp_path):
    glslc = shutil.which("glslc")
    if glslc is None:
        skip_unavailable("vulkan", "glslc, which builds its shaders, is not installed")
    manifest = build_shaders.load_manifest()
    if build_shaders.glslc_version(glslc) != manifest["glslc"]:
        skip_unavailable("vulkan", f"the .spv files were built by {manifest['glslc']}, not this glslc "
                                   f"({build_shaders.glslc_version(glslc)})")
    for name, entry in manifest["shaders"].items():
        out = tmp_path / name
        build_shaders.compile_variant(glslc, entry["source"][: -len(".comp")], entry["defines"], out)
        assert out.read_bytes() == (build_shaders.SHADER_DIR / name).read_bytes(), name
