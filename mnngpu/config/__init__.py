"""The model configuration: the one table of keys (`keys.py`: default, check, status, when read)
and LlmConfig, which merges a model folder's files and overrides and checks them against it."""

from mnngpu.config.keys import DEFAULTS, KEYS, KNOWN_KEYS, LOAD_TIME_KEYS
from mnngpu.config.llm_config import (
    CONFIG_FILE,
    CONFIG_FLAG,
    KNOWN_BACKENDS,
    SET_CONFIG,
    CommandLine,
    ConfigNote,
    ConfigWarning,
    LlmConfig,
    as_overrides,
    deep_merge,
)

__all__ = [
    "CONFIG_FILE", "CONFIG_FLAG", "DEFAULTS", "KEYS", "KNOWN_BACKENDS", "KNOWN_KEYS", "LOAD_TIME_KEYS",
    "SET_CONFIG", "CommandLine", "ConfigNote", "ConfigWarning", "LlmConfig", "as_overrides", "deep_merge",
]
