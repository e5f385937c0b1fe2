"""mnngpu: run MNN-exported LLMs on CPU, OpenCL, Vulkan and CUDA backends."""

from mnngpu.errors import (
    BackendUnavailableError,
    ConfigError,
    InputError,
    MnnGpuError,
    ModelFormatError,
    TokenizerError,
    WeightFileError,
)

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "ConfigError",
    "InputError",
    "MnnGpuError",
    "ModelFormatError",
    "TokenizerError",
    "WeightFileError",
    "__version__",
]
