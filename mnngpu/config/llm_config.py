"""LlmConfig: the merged model configuration, with MNN's defaults, typed getters and checks.

The load order follows MNN's engine:

1. `config.json` (runtime settings). `base_dir` is its folder unless it sets `base_dir`.
2. `llm_config.json` (the model's facts), found at `base_dir / config["llm_config"]`,
   deep-merged on top: **llm_config.json wins** where both set a key.
3. `set_config(overrides)`, deep-merged on top (the command line's flags go this way too).
4. `context.json` (`base_dir / config["context_file"]`), if present, deep-merged into
   `jinja.context` by `merge_context_file()`, which `Llm.load()` calls, as MNN's `Llm::load`
   does: its keys win over a `set_config` made before the load.

Every value is checked after loading and after each `set_config`; a bad one raises
ConfigError naming the file that set it, the key and what was expected. Keys MNN never
reads draw a ConfigWarning (most often a typo). Each value remembers its source: a file,
`set_config()`, or a command-line flag (CommandLine); errors name a flag's key alone, warnings
name the flag too. Nothing here writes to the model folder.
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mnngpu.backend import REGISTRY
from mnngpu.config.keys import DEFAULTS, JINJA_CHECKS, KEYS, REJECTED, TIE_FIELDS, WARNED
from mnngpu.errors import ConfigError

CONFIG_FILE = "config.json"
SET_CONFIG = "set_config()"  # the "file" an override is blamed on

KNOWN_BACKENDS: tuple[str, ...] = tuple(REGISTRY)


class ConfigWarning(UserWarning):
    """A config file holds something MNN ignores (an unknown key, a base_dir it will not use)."""


class ConfigNote(ConfigWarning):
    """A fact about how an export runs, as in MNN, that no setting of the user's caused (a sliding
    export's window not applied): the command line prints it as `note: ...`, not as a warning."""

    line_prefix = "note"


class CommandLine(str):
    """A source on the command line: a flag (`--config`, `--precision`) or a command's own setting.
    Errors name its key alone, as the user typed it; warnings add the flag."""


CONFIG_FLAG = CommandLine("--config")


def _blamed(source: str | None, key: str) -> str:
    return f"{source}: {key}" if source and not isinstance(source, CommandLine) else key


def _warning_text(source: str | None, key: str, message: str) -> str:
    text = f"{_blamed(source, key)}: {message}"
    return f"{text}; set by {source}" if isinstance(source, CommandLine) else text


def _from_model_folder(source: str | None) -> bool:
    """Whether a value came from one of the model folder's files (not set_config or a flag)."""
    return bool(source) and source != SET_CONFIG and not isinstance(source, CommandLine)


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# ---- merging and reading ---------------------------------------------------------------------

def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """MNN's merge: objects merge key by key, recursively; any other value replaces."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(merged.get(key), dict) and isinstance(value, dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _parse_object(text: str, source: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                          path=source) from exc
    if not isinstance(value, dict):
        raise ConfigError(f"expected a JSON object {{...}} at the top, got {type(value).__name__}",
                          path=source)
    return value


def as_overrides(overrides: str | Mapping[str, Any], source: str | None = SET_CONFIG) -> dict[str, Any]:
    """set_config's argument as a dict: a JSON object string (parsed) or a mapping; errors blame
    `source` (none: only the key)."""
    if isinstance(overrides, str):
        return _parse_object(overrides, source)
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"expected a JSON string or a dict, got {type(overrides).__name__}",
                          path=source or None)
    return dict(overrides)


def _read_object(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError("file not found", path=path) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start})", path=path) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", path=path) from exc
    return _parse_object(text, os.fspath(path))


class LlmConfig:
    """The merged configuration of one model folder."""

    def __init__(self, raw: dict[str, Any], base_dir: Path, config_path: Path | None = None):
        self._raw = raw
        self._base_dir = base_dir
        self._config_path = config_path
        self._origins: dict[str, str] = {}  # dotted key -> its value's source: a file, set_config(), a CommandLine
        self._warned: set[str] = set()  # keys already warned about (as named)
        self._names: dict[str, str] = {}  # key -> how messages name it (section_config: mllm.memory)

    # ---- loading -------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | os.PathLike, check_support: bool = True) -> LlmConfig:
        """Load a model folder (its config.json), a config.json path, or a bare llm.mnn path.
        check_support=False keeps values mnngpu does not compute (inspect lists them: `unsupported`)."""
        path = Path(path)
        if path.suffix == ".mnn":
            return cls._load_bare_model(path, check_support)
        config_path = path / CONFIG_FILE if path.is_dir() else path
        config = _read_object(config_path)
        cfg = cls(config, cls._resolve_base_dir(config, config_path), config_path)
        cfg._record_origins(config, os.fspath(config_path))
        cfg._merge_llm_config()
        cfg.validate(check_support)
        return cfg

    @classmethod
    def _load_bare_model(cls, model_path: Path, check_support: bool) -> LlmConfig:
        # MNN's older usage: a path to llm.mnn stands for {"llm_model": name, "llm_weight": name.weight}.
        if not model_path.is_file():
            raise ConfigError("model file not found", path=model_path)
        config = {"llm_model": model_path.name, "llm_weight": model_path.name + ".weight"}
        cfg = cls(config, model_path.parent.resolve())
        cfg._merge_llm_config()
        cfg.validate(check_support)
        return cfg

    @staticmethod
    def _resolve_base_dir(config: dict[str, Any], config_path: Path) -> Path:
        base_dir = config.get("base_dir")
        if base_dir is None:
            return config_path.parent.resolve()
        if not isinstance(base_dir, str):
            raise ConfigError(f"expected a string, got {_shown(base_dir)}", path=config_path, field="base_dir")
        # As in MNN, a relative base_dir is taken from the working directory, not from the
        # folder of config.json, so a config that works with MNN's tools works here.
        return Path(base_dir).resolve()

    def _merge_llm_config(self) -> None:
        llm_config_path = self._base_dir / self._string("llm_config")
        if not llm_config_path.is_file():
            warnings.warn(f"{llm_config_path}: not found; the model's facts (hidden_size, layer_nums, ...) "
                          "fall back to MNN's defaults", ConfigWarning, stacklevel=3)
            return
        self._merge(_read_object(llm_config_path), os.fspath(llm_config_path))

    def merge_context_file(self) -> None:
        """Deep-merge context.json (context_file), if present, into jinja.context: Llm.load()
        does it, after any set_config, as MNN's does."""
        context_path = self._base_dir / self._string("context_file")
        if context_path.is_file():
            self._merge({"jinja": {"context": _read_object(context_path)}}, os.fspath(context_path))
            self.validate()

    def _merge(self, override: dict[str, Any], source: str) -> None:
        self._raw = deep_merge(self._raw, override)
        self._record_origins(override, source)

    def _record_origins(self, values: dict[str, Any], source: str, prefix: str = "") -> None:
        for key, value in values.items():
            self._origins[prefix + key] = source
            if isinstance(value, dict):
                self._record_origins(value, source, prefix + key + ".")

    def origin(self, dotted_key: str) -> str | None:
        """The file (or set_config()) that set the key's current value, for an error to name; None
        for MNN's default or the command line (the error then names the key alone)."""
        source = self._origin(dotted_key)
        return None if isinstance(source, CommandLine) else source or None

    def is_set(self, dotted_key: str) -> bool:
        """Whether a file, set_config() or the command line set the key (not MNN's default)."""
        return self._origin(dotted_key) is not None

    def _name(self, key: str) -> str:
        return self._names.get(key, key)

    def _origin(self, dotted_key: str) -> str | None:
        while dotted_key:
            if dotted_key in self._origins:
                return self._origins[dotted_key]
            dotted_key = dotted_key.rpartition(".")[0]
        return None

    def _string(self, key: str) -> str:
        # Used while loading, before validate(): a file name must be a string to be opened.
        value = self._raw.get(key, DEFAULTS[key])
        if not isinstance(value, str):
            raise ConfigError(f"expected a file name string, got {_shown(value)}",
                              path=self.origin(key), field=key)
        return value

    # ---- overrides and checks ------------------------------------------------------------

    def set_config(self, overrides: str | Mapping[str, Any], source: str = SET_CONFIG) -> None:
        """Deep-merge overrides (a JSON object string or a dict) on top; then re-check everything.
        Errors and warnings blame `source` (a CommandLine flag: errors name the key alone).

        On a bad value the error is raised and the configuration is left as it was."""
        overrides = as_overrides(overrides, None if isinstance(source, CommandLine) else source)
        if "base_dir" in overrides:
            warnings.warn(_warning_text(source, "base_dir", "ignored; as in MNN, only config.json can set it"),
                          ConfigWarning, stacklevel=2)
        before = (self._raw, dict(self._origins))
        self._merge(overrides, source)
        try:
            self.validate()
        except ConfigError:
            self._raw, self._origins = before
            raise

    def section_config(self, section: str, keys: tuple[str, ...]) -> LlmConfig:
        """A copy whose `keys` take the values the object `section` gives them (MNN's mllm: the
        vision and audio modules' runtime), checked as such: errors and warnings name them
        `section.key` and blame whatever set that (the folder's file, set_config(), a flag)."""
        values = self.value(section) or {}
        config = copy.deepcopy(self)
        for key in keys:
            if key in values:
                config._names[key] = f"{section}.{key}"
                config._merge({key: values[key]}, self._origin(f"{section}.{key}") or "")
        config.validate()
        return config

    def validate(self, check_support: bool = True) -> None:
        """Raise ConfigError for the first bad value; warn about keys MNN does not read."""
        for key, value in self._raw.items():
            if key == "jinja":
                self._validate_jinja(value)
                continue
            entry = KEYS.get(key)
            if entry is None:
                self._warn_once(key, "not a key MNN reads; ignored (a typo?)")
            elif entry.check is not None and not entry.check[1](value):
                self._fail(key, entry.check[0], value)
            if check_support:
                self._check_support(key, value)

    def unsupported(self) -> list[ConfigError]:
        """The error each key whose value changes the math in a way mnngpu does not compute raises at load."""
        found = []
        for key, value in self._raw.items():
            try:
                self._check_support(key, value)
            except ConfigError as error:
                found.append(error)
        return found

    def _check_support(self, key: str, value: Any) -> None:
        """Reject a value that would change the math in a way mnngpu does not compute; warn once
        about a speed- or memory-only value mnngpu does not act on (keys.KEYS)."""
        entry = KEYS.get(key)
        if entry is None:
            return
        if entry.status == REJECTED and not entry.supported[1](value):
            if key == "quant_qkv" and "attention_mode" in self._raw:
                return  # MNN reads quant_qkv only when attention_mode is unset
            raise ConfigError(f"{_shown(value)} is not supported by mnngpu ({entry.note}); "
                              f"supported: {entry.supported[0]}", path=self.origin(key), field=self._name(key))
        if entry.status == WARNED and value != entry.default:
            if entry.quiet_in_folder and _from_model_folder(self._origin(key)):
                return  # the export's tuning of MNN's runtime, not the user's choice (keys.Key)
            self._warn_once(key, f"{_shown(value)} has no effect in mnngpu: {entry.note}")

    def _warn_once(self, key: str, message: str) -> None:
        name = self._name(key)
        if name not in self._warned:
            self._warned.add(name)
            warnings.warn(_warning_text(self._origin(key), name, message), ConfigWarning, stacklevel=4)

    def _validate_jinja(self, jinja: Any) -> None:
        if not isinstance(jinja, dict):
            self._fail("jinja", "a JSON object with chat_template, bos, eos, context", jinja)
        for key, (expected, check) in JINJA_CHECKS.items():
            if key in jinja and not check(jinja[key]):
                self._fail(f"jinja.{key}", expected, jinja[key])

    def _fail(self, key: str, expected: str, value: Any) -> None:
        raise ConfigError(f"expected {expected}, got {_shown(value)}", path=self.origin(key), field=self._name(key))

    def validate_backend(self) -> None:
        """Check backend_type names a backend mnngpu has (whether its driver is present is
        the backend's own check)."""
        if self.backend_type not in KNOWN_BACKENDS:
            self._fail("backend_type", f"one of {list(KNOWN_BACKENDS)}", self.backend_type)

    # ---- raw access ----------------------------------------------------------------------

    @property
    def raw(self) -> dict[str, Any]:
        """The merged configuration as a plain dict (a copy; for Sampler and Prompt)."""
        return copy.deepcopy(self._raw)

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    @property
    def config_path(self) -> Path | None:
        return self._config_path

    def get(self, key: str, default: Any = None) -> Any:
        """The merged value of key, or default when no file set it (MNN's defaults not applied)."""
        return copy.deepcopy(self._raw.get(key, default))

    def value(self, key: str) -> Any:
        """The merged value of key, or MNN's default for it."""
        return copy.deepcopy(self._raw.get(key, DEFAULTS.get(key)))

    def writable_folder(self, key: str, needed_by: str) -> Path:
        """The folder `key` names (taken from the working directory, as MNN does), for files
        `needed_by` writes; a ConfigError when it is unset or inside the model folder, since
        nothing is ever written there."""
        value = self.value(key)
        if not value:
            raise ConfigError(f"{needed_by} needs a folder for its files; set {key}", path=self.origin(key),
                              field=key)
        folder = Path(value).resolve()
        base = self._base_dir.resolve()
        if folder == base or base in folder.parents:
            raise ConfigError(f"{folder} is inside the model folder, which mnngpu never writes to; choose "
                              "another folder", path=self.origin(key), field=key)
        return folder

    def _file(self, key: str) -> Path:
        return self._base_dir / self._raw.get(key, DEFAULTS[key])

    # ---- runtime -------------------------------------------------------------------------

    @property
    def backend_type(self) -> str:
        return self.value("backend_type")

    @property
    def thread_num(self) -> int:
        return self.value("thread_num")

    @property
    def precision(self) -> str:
        return self.value("precision")

    @property
    def power(self) -> str:
        return self.value("power")

    @property
    def memory(self) -> str:
        return self.value("memory")

    @property
    def strict_device(self) -> bool:
        return self.value("strict_device")

    @property
    def int8_activations(self) -> bool:
        return self.value("int8_activations")

    @property
    def use_mmap(self) -> bool:
        return self.value("use_mmap")

    @property
    def kvcache_mmap(self) -> bool:
        return self.value("kvcache_mmap")

    @property
    def dynamic_option(self) -> int:
        return self.value("dynamic_option")

    @property
    def attention_mode(self) -> int:
        """attention_mode, falling back to the deprecated quant_qkv, as MNN reads it."""
        return self._raw.get("attention_mode", self.value("quant_qkv"))

    @property
    def tmp_path(self) -> str:
        return self.value("tmp_path")

    @property
    def prefix_cache_path(self) -> str:
        return self.value("prefix_cache_path")

    # ---- generation ----------------------------------------------------------------------

    @property
    def max_new_tokens(self) -> int:
        return self.value("max_new_tokens")

    @property
    def max_all_tokens(self) -> int:
        return self.value("max_all_tokens")

    @property
    def reuse_kv(self) -> bool:
        return self.value("reuse_kv")

    @property
    def all_logits(self) -> bool:
        return self.value("all_logits")

    @property
    def chunk_size(self) -> int:
        """The most ids one prefill forward takes (0: no limit): the largest of chunk_limits when
        set, which then overrides chunk, as in MNN."""
        limits = self._raw.get("chunk_limits")
        return max(limits) if limits else self.value("chunk")

    @property
    def use_template(self) -> bool:
        return self.value("use_template")

    @property
    def system_prompt(self) -> str:
        return self.value("system_prompt")

    @property
    def hidden_states(self) -> bool:
        return self.value("hidden_states")

    # ---- the model's facts ---------------------------------------------------------------

    @property
    def hidden_size(self) -> int:
        return self.value("hidden_size")

    @property
    def layer_nums(self) -> int:
        return self.value("layer_nums")

    @property
    def model_type(self) -> str:
        return self.value("model_type")

    @property
    def attention_mask(self) -> str:
        return self.value("attention_mask")

    @property
    def attention_type(self) -> str:
        return self.value("attention_type")

    @property
    def sliding_window(self) -> int:
        return self.value("sliding_window")

    @property
    def is_mrope(self) -> bool:
        return self.value("is_mrope")

    @property
    def attn_scale(self) -> float | None:
        """The attention scale the export recorded; None when it recorded none (1/sqrt(head_dim))."""
        value = self._raw.get("attn_scale")
        return None if value is None else float(value)

    @property
    def tie_embeddings(self) -> list[int] | None:
        """The quantized embedding's layout: [weight_offset, alpha_offset, alpha_size, quant_bit,
        quant_block(, alpha_fp16)], or None for a bf16 embedding file. weight_offset 0 means the
        rows are in embedding_file (an int8/int4 export); otherwise they are the tied lm_head's
        inside llm.mnn.weight. MNN's newer object form comes back in the same order, with alpha_fp16."""
        value = self._raw.get("tie_embeddings")
        if value is None:
            return None
        if isinstance(value, dict):
            fields = [int(value.get(name, 0)) for name in TIE_FIELDS]
            return fields + [int(value.get("alpha_dtype", "fp32") == "fp16")]
        return list(value)

    @property
    def jinja(self) -> dict[str, Any]:
        """chat_template, bos, eos (each only when set) and context (always, {} when unset)."""
        jinja = self.value("jinja") or {}
        jinja.setdefault("context", {})
        return jinja

    # ---- files ---------------------------------------------------------------------------

    @property
    def model_path(self) -> Path:
        return self._file("llm_model")

    @property
    def weight_path(self) -> Path:
        return self._file("llm_weight")

    @property
    def tokenizer_file(self) -> str:
        """The configured tokenizer file name; tokenizer_path is it joined to base_dir."""
        return self.value("tokenizer_file")

    @property
    def tokenizer_path(self) -> Path:
        return self._file("tokenizer_file")

    @property
    def embedding_path(self) -> Path:
        """base_dir / embedding_file (the exporter sets embedding_file for its int8/int4 files)."""
        return self._file("embedding_file")

    @property
    def embedding_rows_path(self) -> Path:
        """The file MNN reads embedding rows from: llm.mnn.weight for an embedding tied to the
        lm_head (tie_embeddings with a non-zero weight_offset), else embedding_path."""
        tie = self.tie_embeddings
        return self.weight_path if tie is not None and tie[0] != 0 else self.embedding_path

    @property
    def context_path(self) -> Path:
        return self._file("context_file")

    @property
    def mtp_model_path(self) -> Path:
        return self._file("mtp_model")

    @property
    def eagle_model_path(self) -> Path:
        return self._file("eagle_model")

    @property
    def eagle_fc_path(self) -> Path:
        return self._file("eagle_fc")

    @property
    def eagle_d2t_path(self) -> Path:
        return self._file("eagle_d2t")

    @property
    def lookup_file_path(self) -> Path:
        return self._file("lookup_file")

    # ---- sampler and speculative decoding ------------------------------------------------

    @property
    def sampler_type(self) -> str:
        return self.value("sampler_type")

    @property
    def mixed_samplers(self) -> list[str]:
        return self.value("mixed_samplers")

    @property
    def speculative_type(self) -> str:
        return self.value("speculative_type")

    @property
    def draft_predict_length(self) -> int:
        return self.value("draft_predict_length")

    @property
    def ngram_match_maxlen(self) -> int:
        return self.value("ngram_match_maxlen")

    @property
    def eagle_depth(self) -> int:
        return self.value("eagle_depth")

    @property
    def eagle_topk(self) -> int:
        return self.value("eagle_topk")

    def __repr__(self) -> str:
        return f"LlmConfig(base_dir={os.fspath(self._base_dir)!r}, model_type={self.model_type!r})"
