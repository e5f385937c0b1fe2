"""Kernel sources shipped with mnngpu: OpenCL `.cl` files and Vulkan `.comp` with their built `.spv`."""

from pathlib import Path

SHADER_DIR = Path(__file__).resolve().parent


def shader_path(kind: str, name: str) -> Path:
    """Path of a shipped kernel file, e.g. shader_path("vulkan", "gemv_q4.spv")."""
    return SHADER_DIR / kind / name
