"""Configuration and loading: set_config, load (runtime, tokenizer, embedding, prompt, sampler,
Module.load, ModulePool), the tokenizer and chat-template properties, the LoRA base, the checks
on a config that load() makes."""

from __future__ import annotations

import time
import warnings

import numpy as np

from mnngpu.backend import backend_class
from mnngpu.config import LOAD_TIME_KEYS, ConfigNote, ConfigWarning, LlmConfig, as_overrides
from mnngpu.embedding import PLE_KEY, DiskEmbedding, PerLayerEmbedding
from mnngpu.engine.embedding_model import refuse_embedding_graph
from mnngpu.errors import ConfigError, MnnGpuError, ModelFormatError, WeightFileError
from mnngpu.format import read_net
from mnngpu.generation.factory import create_strategy
from mnngpu.runtime.attention_mask import mask_feed, sliding_unwindowed_note
from mnngpu.runtime.module import Module, ModuleConfig
from mnngpu.runtime.module_pool import ModulePool
from mnngpu.runtime.prefix_cache import PrefixCache, cache_directory, model_key
from mnngpu.runtime.schedule import RuntimeManager
from mnngpu.runtime.static_module import weights_location
from mnngpu.runtime.validate import cache_layout, check_hidden_size, graph_inputs, uses_ple, validate_model
from mnngpu.sampler import Sampler
from mnngpu.tokenizer import load_tokenizer


def position_axes(net) -> int:
    """How many rows the graph's position_ids input takes: 3 for an mrope export, else 1 (as MNN
    reads the input's first dimension)."""
    for op in net.ops:
        if op.type == "Input" and op.name == "position_ids":
            dims = list(getattr(op.param, "dims", None) or [])
            return 3 if dims and dims[0] == 3 else 1
    return 1


def _open_prefix_cache(cfg: LlmConfig) -> PrefixCache | None:
    directory = cache_directory(cfg)
    if directory is None:
        return None
    if not backend_class(cfg.backend_type).caps.kv_transfer:
        raise ConfigError(f"the prefix cache is not implemented on the {cfg.backend_type} backend",
                          path=cfg.origin("prefix_cache_path"), field="prefix_cache_path")
    return PrefixCache(directory, lambda: model_key(cfg))


def _check_lora_shares_the_base(net, base, lora_path) -> None:
    """A LoRA graph holds every weight op of its base model, reading the same place in the weight
    file; one that does not was made for another model (checked before any weight is read)."""
    locations = {op.name: weights_location(op) for op in net.ops}
    missing = [name for name, (location, _) in base.pipeline_module.static_module.weight_nodes.items()
               if locations.get(name) != location]
    if missing:
        raise ModelFormatError(f"not a LoRA graph of this model: its op {missing[0]} (and {len(missing) - 1} more) "
                               "does not read the base model's weights where the base's does", path=lora_path)


def _attention_mask(cfg: LlmConfig) -> np.ndarray:
    """The attention_mask feed for this model; says out loud where the window is not applied."""
    if cfg.attention_type == "mix" and cfg.sliding_window < 1:
        raise ConfigError("attention_type mix needs a sliding_window of at least 1 (MNN's sliding mask "
                          "would hide every key)", path=cfg.origin("sliding_window"), field="sliding_window")
    note = sliding_unwindowed_note(cfg.attention_type, cfg.sliding_window)
    if note:
        warnings.warn(f"{cfg.origin('attention_type')}: {note}", ConfigNote, stacklevel=3)
    return mask_feed(cfg.attention_type, cfg.sliding_window)


def _per_layer_embedding(cfg: LlmConfig, vocab_size: int) -> PerLayerEmbedding | None:
    """Gemma 4's per-layer embedding table when ple_embed_file is set (validate_model checked the graph)."""
    if not uses_ple(cfg):
        return None
    return PerLayerEmbedding(cfg.base_dir / cfg.get(PLE_KEY), cfg.value("ple_embed_dim"),
                             cfg.value("ple_embed_scale"), vocab_size, cfg.origin(PLE_KEY))


def _warn_load_time_keys(overrides: dict) -> None:
    late = sorted(LOAD_TIME_KEYS & set(overrides))
    if late:
        warnings.warn(f"set_config(): {', '.join(late)}: set after load(); takes effect at the next load()",
                      ConfigWarning, stacklevel=3)


class LlmLoading:
    """load() sets the model's state: runtime, prefix_cache, embedding, cache_layout,
    per_layer_embedding, graph_inputs, attention_mask, position_axes, sampler, strategy, pool, and
    `_tokenizer`, `_prompt` (lazy, see the properties) and `_loaded`; set_config() changes config
    and, once loaded, the sampler and prompt. Uses `_lora_base` (create_lora)."""

    # ---- configuration and loading ---------------------------------------------------------
    def set_config(self, overrides: str | dict) -> bool:
        """Merge overrides into the config. After load() they reach the chat template
        (system_prompt, use_template, jinja) and the sampler; a key only load() reads takes
        effect at the next load(), and says so."""
        overrides = as_overrides(overrides)
        self.config.set_config(overrides)
        if self._loaded:
            self._prompt = None
            self.sampler = Sampler(self.config.raw)
            _warn_load_time_keys(overrides)
        return True

    def load(self, progress=None) -> None:
        """`progress(stage, done, total)`, when given, hears each load stage start and end."""
        report = progress or (lambda stage, done, total: None)
        start = time.perf_counter()
        cfg = self.config
        self._tokenizer = load_tokenizer(cfg.base_dir, cfg.tokenizer_file)  # first, as in MNN: fail early
        cfg.merge_context_file()
        self.runtime = RuntimeManager.from_config(cfg)
        self.prefix_cache = _open_prefix_cache(cfg)
        report("weights mapped", 0, 1)
        try:
            self.embedding = DiskEmbedding(cfg.hidden_size, cfg.embedding_path, cfg.weight_path, cfg.tie_embeddings,
                                           cfg.origin("tie_embeddings"))
        except WeightFileError:
            check_hidden_size(read_net(cfg.model_path), cfg)   # rows laid out by a wrong hidden_size: say that
            raise
        try:
            net = validate_model(cfg, self.embedding)
        except ModelFormatError:
            refuse_embedding_graph(cfg.model_path)   # says what the folder is, where it is that
            raise
        self.cache_layout = cache_layout(net) if self.prefix_cache is not None else None
        self.per_layer_embedding = _per_layer_embedding(cfg, self.embedding.vocab_size)
        report("weights mapped", 1, 1)
        self.graph_inputs = graph_inputs(net)
        self.attention_mask = _attention_mask(cfg)
        self.position_axes = position_axes(net)
        self._prompt = None
        self.sampler = Sampler(cfg.raw)
        self.strategy = create_strategy(cfg, net.output_names, self.embedding, self.runtime.placements)
        module_config = ModuleConfig(shape_mutable=not self.runtime.fixed_shape, rearrange=True,
                                     base=self._base_module())
        report("weights packed", 0, 1)
        if module_config.base is not None:
            _check_lora_shares_the_base(net, module_config.base, cfg.model_path)
        prefill = Module.load(cfg.model_path, cfg.weight_path, module_config, self.runtime, net=net)
        self.pool = ModulePool(prefill, cfg.all_logits, self.strategy.verify_length,
                               self.runtime.schedule.backend_config.prefill_widths)
        report("weights packed", 1, 1)
        if cfg.int8_activations and not self.runtime.backend().lane_layers:
            raise ConfigError("true, but this model has no int4 layer the CPU's lane kernels run (int4 weights in "
                              "blocks of a multiple of 64), so nothing would be quantized to int8",
                              path=cfg.model_path, field="int8_activations")
        self._loaded = True
        self.runtime.sequence.context = self.context
        self.placement()   # every fallback known (or, under strict_device, refused) before the first token
        self.context.load_us = int((time.perf_counter() - start) * 1e6)

    @property
    def tokenizer(self):
        """Loaded by load(); before it, on first use."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.config.base_dir, self.config.tokenizer_file)
        return self._tokenizer

    @property
    def prompt(self):
        """The chat-template renderer; like MNN, it also reads the template, eos and bos that a
        .mtok tokenizer carries (a tokenizer.txt has no bos for the template)."""
        if self._prompt is None:
            from mnngpu.prompt import Prompt

            tok = self.tokenizer
            self._prompt = Prompt(self.config.raw, tokenizer_template=tok.chat_template or "",
                                  tokenizer_eos=tok.eos_token or "", tokenizer_bos=tok.bos_token or "")
        return self._prompt

    # ---- LoRA -----------------------------------------------------------------------------------
    def _base_module(self):
        """The module whose weights this load shares (create_lora), or None."""
        if self._lora_base is None:
            return None
        if not backend_class(self.config.backend_type).caps.host_weights:
            warnings.warn(f"create_lora: the {self.config.backend_type} backend keeps weights in device memory "
                          "per model, so the LoRA model holds its own copy", ConfigWarning, stacklevel=3)
            return None
        return next(iter(self._lora_base.pool.modules.values()))

    def _require_loaded(self) -> None:
        if not self._loaded:
            raise MnnGpuError("call load() first")
