"""The one error family every mnngpu failure belongs to.

Each message names the file, the field (or byte offset) and what was expected,
so a user can fix the input without reading a traceback.
"""

from __future__ import annotations

import os


class MnnGpuError(Exception):
    """Base class: anything mnngpu reports about bad input or a missing driver."""

    def __init__(self, message: str, *, path: str | os.PathLike | None = None, field: str | None = None):
        self.path = os.fspath(path) if path is not None else None
        self.field = field
        where = []
        if self.path is not None:
            where.append(self.path)
        if field is not None:
            where.append(field)
        prefix = ": ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class ConfigError(MnnGpuError):
    """config.json / llm_config.json / context.json is unreadable or holds a wrong value."""


class ModelFormatError(MnnGpuError):
    """llm.mnn is not a valid MNN graph, or uses something mnngpu does not run."""


class WeightFileError(MnnGpuError):
    """llm.mnn.weight or an embeddings file is missing, short, or disagrees with the graph."""


class TokenizerError(MnnGpuError):
    """The tokenizer file is missing or damaged."""


class BackendUnavailableError(MnnGpuError):
    """The requested backend's driver or Python package is not installed."""


class InputError(MnnGpuError):
    """A caller passed an id, prompt or argument the model cannot take."""


class CacheFileError(MnnGpuError):
    """A prefix-cache file is damaged or was made by another model or other settings."""
