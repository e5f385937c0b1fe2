"""The backends by name: `backend_type` -> the Backend class, imported only when chosen, and which
backends implement which op types (their `executions` tables), and which driver package is missing here."""

from __future__ import annotations

import importlib
import importlib.util

from mnngpu.backend.interface import Backend, BackendConfig
from mnngpu.errors import BackendUnavailableError, ConfigError

# backend_type -> (module, class name). The module is imported only when asked for, so a
# missing driver package only matters to the user who picks that backend.
REGISTRY: dict[str, tuple[str, str]] = {
    "cpu": ("mnngpu.backends.cpu", "CPUBackend"),
    "opencl": ("mnngpu.backends.opencl", "OpenCLBackend"),
    "vulkan": ("mnngpu.backends.vulkan", "VulkanBackend"),
    "cuda": ("mnngpu.backends.cuda", "CUDABackend"),
}


def backend_class(backend_type: str) -> type[Backend]:
    if backend_type not in REGISTRY:
        raise ConfigError(f"unknown backend_type '{backend_type}', expected one of {sorted(REGISTRY)}",
                          field="backend_type")
    module_name, class_name = REGISTRY[backend_type]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend '{backend_type}' needs a package that is not installed ({exc.name}); "
            f"install it with: pip install 'mnngpu[{backend_type}]'", field="backend_type") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise BackendUnavailableError(f"backend '{backend_type}' is not built into this mnngpu", field="backend_type")
    return cls


def create_backend(backend_type: str, config: BackendConfig, kv_meta=None) -> Backend:
    """Instantiate a backend; its constructor raises BackendUnavailableError when no driver/device."""
    return backend_class(backend_type)(config, kv_meta)


def backend_op_tables() -> dict[str, frozenset[str] | None]:
    """Each registered backend type's op types (its `executions` keys); None where its package is missing."""
    tables: dict[str, frozenset[str] | None] = {}
    for backend_type in REGISTRY:
        try:
            tables[backend_type] = frozenset(backend_class(backend_type).executions)
        except BackendUnavailableError:
            tables[backend_type] = None
    return tables


def implemented_by(op_type: str) -> list[str]:
    """The backend types whose op table has `op_type` (backends whose package is missing are left out)."""
    return [backend_type for backend_type, table in backend_op_tables().items()
            if table is not None and op_type in table]


# The Python package each device backend drives its device through (pyproject.toml's extra of the
# backend's name installs it). The Vulkan and CUDA backends import theirs only when they start, so
# their op tables load without it: whether it is installed is asked of the package itself.
DRIVER_PACKAGES = {"opencl": "pyopencl", "vulkan": "vulkan", "cuda": "cupy"}


def missing_package(backend_type: str) -> str | None:
    """The package `backend_type` needs that is not installed here, or None."""
    package = DRIVER_PACKAGES.get(backend_type)
    if package is None:
        return None
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else package
