"""Llm, the engine: MNN's LLM flow in Python, readable top-down (mnngpu.llm is its public face).

    llm = Llm(LlmConfig.load("model_dir/config.json"))   # config.json ⊕ llm_config.json ⊕ context.json
    llm.set_config('{"backend_type": "cpu"}')
    llm.load()        # runtime, tokenizer, embedding, prompt, sampler, Module.load, ModulePool
    logits = llm.forward(llm.tokenizer_encode("hello"))   # KV cache kept between calls
    print(llm.response("hello"))
"""

from __future__ import annotations

import copy
import os

import numpy as np

from mnngpu.config import LlmConfig
from mnngpu.engine.context import LlmContext
from mnngpu.engine.feeds import LlmFeeds
from mnngpu.engine.forward import LlmForward
from mnngpu.engine.generation import LlmGeneration
from mnngpu.engine.loading import LlmLoading
from mnngpu.engine.prefix import LlmPrefix
from mnngpu.engine.sequences import LlmSequences
from mnngpu.runtime.prefix_cache import PrefixCache


class Llm(LlmLoading, LlmGeneration, LlmForward, LlmFeeds, LlmSequences, LlmPrefix):
    """The engine: the parts (mnngpu.engine's other modules, one concern each) over one state, set
    here and by load(); `context` is the current sequence's."""

    def __init__(self, config: LlmConfig):
        self.config = config
        self._loaded = False
        self.context = LlmContext()
        self._tokenizer = None
        self._lora_base: Llm | None = None   # create_lora(): the model whose weights this one shares
        self.prefix_cache: PrefixCache | None = None
        self.cache_layout = None   # backend.kv.CacheLayout, read at load when the prefix cache is on
        self._verified: list[int] = []   # the last verify block, until discard()
        self.batch_width = 1   # rows of a fixed-shape backend's batched decode module (generation.batch sets it)
        self._hidden_parts: list[np.ndarray] = []   # hidden_states rows of the last forward or verify

    @property
    def context(self) -> LlmContext:
        """The current sequence's history and counts (each sequence keeps its own: use_sequence)."""
        return self._context

    @context.setter
    def context(self, value: LlmContext) -> None:
        self._context = value
        if self._loaded:
            self.runtime.sequence.context = value

    # ---- LoRA -----------------------------------------------------------------------------------
    def create_lora(self, lora_path: str | os.PathLike) -> Llm:
        """A loaded Llm that runs the LoRA graph `lora_path` (the lora.mnn `llmexport --lora_split`
        writes; relative to base_dir, as MNN takes llm_model) on this model's weights, as MNN's
        create_lora does: every layer the two graphs share uses this model's packed weights in
        memory (CPU backend), the adapters' own small layers are the LoRA graph's. It has its own
        KV cache and context."""
        self._require_loaded()
        config = copy.deepcopy(self.config)
        config.set_config({"llm_model": os.fspath(lora_path), "use_mmap": False})
        lora = Llm(config)
        lora._lora_base = self
        lora.load()
        return lora
