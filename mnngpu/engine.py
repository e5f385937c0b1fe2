"""Llm, the engine: MNN's LLM flow in Python, readable top-down (mnngpu.llm is its public face).

    llm = Llm(LlmConfig.load("model_dir/config.json"))   # config.json ⊕ llm_config.json ⊕ context.json
    llm.set_config('{"backend_type": "cpu"}')
    llm.load()        # runtime, tokenizer, embedding, prompt, sampler, Module.load, ModulePool
    logits = llm.forward(llm.tokenizer_encode("hello"))   # KV cache kept between calls
    print(llm.response("hello"))
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from mnngpu.backend import backend_class
from mnngpu.backend.kv import Segment, Sequence
from mnngpu.backend.widths import PREFILL_LEN
from mnngpu.config import LOAD_TIME_KEYS, ConfigNote, ConfigWarning, LlmConfig, as_overrides
from mnngpu.embedding import PLE_KEY, DiskEmbedding, PerLayerEmbedding
from mnngpu.errors import ConfigError, InputError, MnnGpuError, ModelFormatError
from mnngpu.generation.factory import create_strategy
from mnngpu.generation.steps import DecodeSteps
from mnngpu.runtime.attention_mask import mask_feed, sliding_unwindowed_note
from mnngpu.runtime.module import Module, ModuleConfig
from mnngpu.runtime.module_pool import ModulePool
from mnngpu.runtime.placement import PlacementTable
from mnngpu.runtime.prefix_cache import PrefixCache, cache_directory, model_key
from mnngpu.runtime.schedule import RuntimeManager
from mnngpu.runtime.static_module import weights_location
from mnngpu.runtime.validate import PLE_FEED, cache_layout, graph_inputs, uses_ple, validate_model
from mnngpu.sampler import Sampler
from mnngpu.tokenizer import load_tokenizer

CAUSAL_MASK = mask_feed("full", 0)

def graph_feeds(embeds: np.ndarray, first_position: int, all_logits: bool,
                mask: np.ndarray = CAUSAL_MASK, positions: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The graph inputs for `embeds` [rows, 1, hidden] at positions from `first_position`, or at
    `positions` [axes, rows] (an mrope graph takes three rows: time, height, width); `mask` is the
    model's attention_mask feed (runtime.attention_mask.mask_feed)."""
    rows = embeds.shape[0]
    if positions is None:
        positions = (first_position + np.arange(rows, dtype=np.int32)).reshape(1, rows)
    return {"input_ids": embeds, "attention_mask": mask,
            "position_ids": positions, "logits_index": np.array([0 if all_logits else -1], dtype=np.int32)}


def position_axes(net) -> int:
    """How many rows the graph's position_ids input takes: 3 for an mrope export, else 1 (as MNN
    reads the input's first dimension)."""
    for op in net.ops:
        if op.type == "Input" and op.name == "position_ids":
            dims = list(getattr(op.param, "dims", None) or [])
            return 3 if dims and dims[0] == 3 else 1
    return 1


def _chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i: i + size] for i in range(0, len(ids), size)]


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


class Logits(np.ndarray):
    """float32 logits that also answer MNN's `Var.read()`, so code written for MNN runs as is."""

    def read(self) -> np.ndarray:
        return np.asarray(self)


@dataclass
class LlmContext:
    prompt_len: int = 0
    gen_seq_len: int = 0
    all_seq_len: int = 0
    history_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    prefill_us: int = 0
    decode_us: int = 0
    load_us: int = 0
    prefix_cached: int = 0   # tokens of the last prompt read from the prefix cache instead of prefilled


class Llm:
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
        self.embedding = DiskEmbedding(cfg.hidden_size, cfg.embedding_path, cfg.weight_path, cfg.tie_embeddings,
                                       cfg.origin("tie_embeddings"))
        net = validate_model(cfg, self.embedding)
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

    # ---- tokens ------------------------------------------------------------------------------
    def tokenizer_encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def count_prompt_tokens(self, text: str, media: dict[str, bytes] | None = None) -> int:
        """`media`: the images and audio a prompt's tags name (an Omni's); a text model has none."""
        return len(self.tokenizer_encode(text))

    def media_sources(self, media: dict[str, bytes]):
        """A context in which prompts may name these images and clips (an Omni's); a text model takes none."""
        if media:
            raise InputError("this model reads no images or audio (is_visual and is_audio are false)",
                             field="messages")
        return contextlib.nullcontext()

    def tokenizer_decode(self, token: int) -> str:
        return self.tokenizer.decode(int(token))

    def apply_chat_template(self, messages) -> str:
        self._require_loaded()
        return self.prompt.apply_chat_template(messages)

    # ---- the forward pass --------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the KV cache, the recurrent state (backend.kv.state_step: the next forward keeps no
        token, so it starts from zero state) and the history."""
        if self._loaded:
            self.runtime.kv_meta.clear()
        self._verified = []
        self.context = LlmContext(load_us=self.context.load_us)

    def _check_ids(self, ids) -> list[int]:
        ids = self.token_ids(ids)
        total = self.runtime.kv_meta.kept + len(ids)
        if total > self.config.max_all_tokens:
            raise InputError(f"{total} tokens exceed max_all_tokens={self.config.max_all_tokens}",
                             field="max_all_tokens")
        return ids

    def token_ids(self, ids) -> list[int]:
        """`ids` as a list of ints, checked: 1-D, not empty, inside the vocabulary."""
        array = np.asarray(ids)
        if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
            raise InputError(f"expected a 1-D list of integer token ids, got {array.dtype} {array.shape}",
                             field="input_ids")
        if array.size == 0:
            raise InputError("no token ids given", field="input_ids")
        vocab = self.embedding.vocab_size
        bad = array[(array < 0) | (array >= vocab)]
        if bad.size:
            raise InputError(f"token id {int(bad[0])} is outside the vocabulary [0, {vocab})", field="input_ids")
        return [int(i) for i in array]

    def _run(self, ids: list[int], all_logits: bool, verify: bool = False) -> np.ndarray:
        """One module forward over `ids` (at most one chunk; with `verify`, the verify module
        and all logits). Returns logits [seq, vocab] with all_logits, else the module's last row
        [1, vocab]. A fixed-shape backend pads a chunk to the rows of the smallest prefill module
        that holds it (ModulePool.width); the padded rows' keys are overwritten later and never
        attended to, since KVMeta only adds the real count."""
        meta = self.runtime.kv_meta
        seq = len(ids)
        padded = self.runtime.fixed_shape and not verify and not (seq == 1 and not all_logits)
        rows = self.pool.width(seq) if padded else seq
        module = self.pool.verify() if verify else self.pool.select(seq, all_logits)
        embeds = np.zeros((rows, 1, self.config.hidden_size), dtype=np.float32)
        embeds[:seq, 0] = self._embed(ids)
        feeds = graph_feeds(embeds, meta.kept, all_logits, self.attention_mask,
                            self._positions(meta.kept, seq, rows)) | self._extra_feeds(rows)
        feeds |= self._ple_feed(ids, rows)
        meta.add = seq
        wanted = ["logits", "hidden_states"] if self.strategy.needs_hidden_states else ["logits"]
        logits, *hidden = module.forward(feeds, wanted)
        meta.sync()
        if hidden:
            hidden = np.asarray(hidden[0], dtype=np.float32)
            self._hidden_parts.append(hidden.reshape(-1, hidden.shape[-1])[:seq])
        logits = np.asarray(logits, dtype=np.float32).reshape(-1, logits.shape[-1])
        return logits[:seq] if all_logits else logits[-1:]

    def hidden_states(self) -> np.ndarray:
        """The graph's hidden_states output [ids, width] for the ids of the last forward() or
        verify(), where the generation strategy reads it (EAGLE); else empty."""
        if not self._hidden_parts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.concatenate(self._hidden_parts, axis=0)

    def placement(self) -> PlacementTable:
        """Where every op runs, for the prefill and the decode module's shapes (decided, not resized)."""
        self._require_loaded()
        for (_, rows, all_logits), module in self.pool.modules.items():
            embeds = np.zeros((rows, 1, self.config.hidden_size), dtype=np.float32)
            module.session.place(graph_feeds(embeds, 0, all_logits, self.attention_mask,
                                             self._positions(0, 0, rows)) | self._extra_feeds(rows)
                                 | self._ple_feed([], rows))
        return self.runtime.placements

    def _embed(self, ids: list[int]) -> np.ndarray:
        """The input rows [seq, hidden] of `ids` (Omni puts its images' rows in)."""
        return self.embedding.rows(ids)

    def _extra_feeds(self, rows: int) -> dict[str, np.ndarray]:
        """Graph inputs beyond FEEDS for a run of `rows` rows (Omni: Qwen3-VL's deepstack_embeds)."""
        return {}

    def _ple_feed(self, ids: list[int], rows: int) -> dict[str, np.ndarray]:
        """Gemma 4's ple_embeddings [1, rows, ple_embed_dim]: the per-layer rows of `ids`, zero rows after
        them (the padding of a fixed-shape run); none for a model without per-layer embeddings."""
        if self.per_layer_embedding is None:
            return {}
        return {PLE_FEED: self.per_layer_embedding.rows(ids, rows)}

    def _positions(self, first: int, seq: int, rows: int) -> np.ndarray:
        """int32 [axes, rows]: positions first.. on every axis (an mrope graph's three agree for text)."""
        return np.tile(first + np.arange(rows, dtype=np.int32), (self.position_axes, 1))

    def _rows_per_run(self, count: int) -> int:
        """How many ids one module forward takes: a fixed-shape backend's PREFILL_LEN, else all of
        them; `chunk` (or the largest of `chunk_limits`) splits a longer prefill, as MNN's does."""
        block = self.config.chunk_size
        limit = PREFILL_LEN if self.runtime.fixed_shape else count
        return min(block, limit) if block else limit

    def padded_rows(self, count: int) -> int:
        """Rows a forward of `count` ids computes beyond them: on a fixed-shape backend the last
        prefill chunk is padded up to its module's rows (see forward); none on the CPU."""
        if not self.runtime.fixed_shape or count <= 1:
            return 0
        prefilled = count if self.config.all_logits else count - 1
        pieces = self.pool.pieces(prefilled, self._rows_per_run(count))
        # a last piece of one id without all_logits runs in the decode module, unpadded (_run)
        return sum(self.pool.width(piece) - piece for piece in pieces if piece > 1 or self.config.all_logits)

    def _prefill_chunks(self, ids: list[int], count: int) -> list[list[int]]:
        """`ids` cut into one module forward each; `count` ids in all decide the chunk size. A
        fixed-shape backend's last short piece goes to its smallest prefill modules that fit (ModulePool.pieces)."""
        size = self._rows_per_run(count)
        if not self.runtime.fixed_shape:
            return _chunks(ids, size)
        pieces = self.pool.pieces(len(ids), size)
        return [ids[end - piece: end] for end, piece in zip(itertools.accumulate(pieces), pieces)]

    def forward(self, ids, all_logits: bool | None = None) -> Logits:
        """Logits [1, 1, vocab] for the last position, or [1, seq, vocab] with all_logits (the
        config's unless given: the server asks for every row to score a prompt's tokens)."""
        self._require_loaded()
        ids = self._check_ids(ids)
        self._hidden_parts = []
        all_logits = self.config.all_logits if all_logits is None else all_logits
        if self.runtime.fixed_shape and not all_logits and len(ids) > 1:
            # In a padded chunk the last real row is not the last row. Prefill all but the last
            # token (the lm_head then runs on one padded row only), and take the last token's
            # logits from the decode module.
            for chunk in self._prefill_chunks(ids[:-1], len(ids)):
                self._run(chunk, all_logits=False)
            logits = self._run(ids[-1:], all_logits=False)
        else:
            parts = [self._run(chunk, all_logits) for chunk in self._prefill_chunks(ids, len(ids))]
            logits = np.concatenate(parts, axis=0) if all_logits else parts[-1]
        self.context.history_tokens.extend(ids)
        self.context.all_seq_len = self.runtime.kv_meta.previous
        return np.ascontiguousarray(logits[None]).view(Logits)

    # ---- several sequences (mnngpu.generation.batch) ------------------------------------------
    def new_sequence(self) -> Sequence:
        """An empty sequence beside the current one: its own KV cache, recurrent states and context."""
        self._require_loaded()
        sequence = self.runtime.new_sequence()
        sequence.context = LlmContext(load_us=self.context.load_us)
        return sequence

    def use_sequence(self, sequence: Sequence) -> None:
        """Make `sequence` the one forward(), generate() and reset() work on; the current one keeps
        its caches and context for when it is used again."""
        self._require_loaded()
        if sequence is self.runtime.sequence:
            return
        if sequence.context is None:
            sequence.context = LlmContext(load_us=self.context.load_us)
        self.runtime.use_sequence(sequence)
        self._context = sequence.context
        self._verified, self._hidden_parts = [], []

    @property
    def sequence(self) -> Sequence:
        """The sequence forward() works on now."""
        return self.runtime.sequence

    def decode_rows(self, sequences: list[Sequence], tokens: list[int]) -> np.ndarray:
        """One forward of one new token for each sequence, each at its own position over its own
        caches, every weight read once for all of them: float32 logits [rows, vocab]. The tokens
        enter their sequences' caches and histories; the current sequence stays current."""
        self._require_loaded()
        if not self.runtime.caps.batched:
            raise MnnGpuError(f"the {self.config.backend_type} backend runs one sequence per forward")
        if len(sequences) != len(tokens) or len({id(s) for s in sequences}) != len(sequences):
            raise InputError("one token for each of distinct sequences", field="input_ids")
        self.token_ids(tokens)
        for sequence in sequences:
            if sequence.meta.kept + 1 > self.config.max_all_tokens:
                raise InputError(f"a sequence would exceed max_all_tokens={self.config.max_all_tokens}",
                                 field="max_all_tokens")
        count = len(tokens)
        # a fixed-shape backend's module has batch_width rows; those past `count` are idle
        rows = max(self.batch_width, count) if self.runtime.fixed_shape else count
        embeds = np.zeros((rows, 1, self.config.hidden_size), dtype=np.float32)
        embeds[:count, 0] = self._embed(tokens)
        firsts = np.zeros(rows, dtype=np.int32)
        firsts[:count] = [sequence.meta.kept for sequence in sequences]
        positions = np.tile(firsts, (self.position_axes, 1))
        feeds = graph_feeds(embeds, 0, True, self.attention_mask, positions) | self._extra_feeds(rows)
        feeds |= self._ple_feed(tokens, rows)
        for sequence in sequences:
            sequence.meta.add = 1
        with self.runtime.batched([Segment(sequence, row, 1) for row, sequence in enumerate(sequences)]):
            logits, = self.pool.rows(rows).forward(feeds, ["logits"])
        for sequence, token in zip(sequences, tokens):
            sequence.meta.sync()
            sequence.context.history_tokens.append(token)
            sequence.context.all_seq_len = sequence.meta.previous
        return np.asarray(logits, dtype=np.float32).reshape(rows, -1)[:count]

    # ---- the prefix cache (prefix_cache_path) -------------------------------------------------
    def cache_prefix(self, ids) -> int:
        """Put the keys and values of `ids`, a prompt's reusable start (a system prompt, a
        document), into the empty KV cache, and the recurrent layers' state after them: read from
        prefix_cache_path when stored there, else prefilled and stored. Returns how many tokens
        were read from disk (0 or len(ids)). generate() then prefills only what follows; it also
        finds a stored prefix by itself."""
        self._require_loaded()
        ids = self._check_ids(ids)
        if self.prefix_cache is None:
            raise ConfigError("not set: the prefix cache needs a folder", field="prefix_cache_path")
        if self.runtime.kv_meta.kept:
            raise InputError("cache_prefix needs an empty KV cache: call reset() first", field="input_ids")
        if self.prefix_cache.path_for(ids).is_file():
            self._restore_prefix(ids)
            return len(ids)
        self.forward(ids)
        self.prefix_cache.store(ids, self.runtime.backend(), self._state_backend())
        return 0

    def _reuse_stored_prefix(self, ids: list[int]) -> int:
        """With an empty KV cache, load the longest stored prefix of `ids`; how many tokens it held."""
        if self.prefix_cache is None or self.runtime.kv_meta.kept:
            return 0
        stored = self.prefix_cache.longest_prefix(ids)
        if stored is None:
            return 0
        self._restore_prefix(stored)
        return len(stored)

    def _restore_prefix(self, ids: list[int]) -> None:
        self.prefix_cache.restore(ids, self.cache_layout, self.runtime.backend(), self._state_backend())
        meta = self.runtime.kv_meta
        meta.previous, meta.remove, meta.reserve = len(ids), 0, []
        self.context.history_tokens.extend(ids)
        self.context.all_seq_len = len(ids)

    def _state_backend(self):
        """The backend whose state_caches hold the recurrent layers' states: the main one where it
        runs LinearAttention, else the CPU backup that placement sent the ops to."""
        main = self.runtime.backend()
        if not self.cache_layout.states or any(p.op_type == "LinearAttention" and p.backend == main.type
                                               for p in self.runtime.placements.entries.values()):
            return main
        return self.runtime.cpu_backup()

    def verify(self, ids) -> Logits:
        """Logits [1, verify_length, vocab] for a speculative block of exactly verify_length ids,
        in one forward of the pool's verify module. Its rows enter the KV cache until discard()."""
        self._require_loaded()
        if not self.pool.verify_length:
            raise MnnGpuError("verify() needs a speculative_type that verifies drafts (lookahead); this model "
                              "loaded for plain decoding")
        ids = self._check_ids(ids)
        if len(ids) != self.pool.verify_length:
            raise InputError(f"a verify block is {self.pool.verify_length} ids (draft_predict_length + 1), "
                             f"got {len(ids)}", field="input_ids")
        self._hidden_parts = []
        self.runtime.kv_meta.verify = True   # discard() may take rows back: recurrent layers keep what rolls them back
        logits = self._run(ids, all_logits=True, verify=True)
        self._verified = ids
        self.context.all_seq_len = self.runtime.kv_meta.previous
        return np.ascontiguousarray(logits[None]).view(Logits)

    def discard(self, keep: int) -> None:
        """Keep only the first `keep` ids of the last verify block in the KV cache; the rest are
        removed (KVMeta remove) before the next forward, without reallocating the cache, and a
        recurrent layer's state rolls back to the kept rows' end then (backend.kv.state_step)."""
        block = self._verified
        if not 0 < keep <= len(block):
            raise InputError(f"keep 1..{len(block)} ids of the verify block, got {keep}", field="keep")
        self.runtime.kv_meta.remove = len(block) - keep
        self.context.history_tokens.extend(block[:keep])
        self.context.all_seq_len = self.runtime.kv_meta.kept
        self._verified = []

    # ---- generation --------------------------------------------------------------------------
    def _finite(self, logits: np.ndarray) -> np.ndarray:
        # min and max carry any NaN or infinity without a vocab-sized temporary, once per token
        if not (np.isfinite(logits.min()) and np.isfinite(logits.max())):
            raise ModelFormatError("the model computed non-finite logits (damaged weights?)",
                                   path=self.config.weight_path)
        return logits

    def _last_logits(self, ids: list[int]) -> np.ndarray:
        return self._finite(np.asarray(self.forward(ids))[0, -1])

    def _room_left(self, count: int = 1) -> bool:
        """Whether `count` more tokens fit in max_all_tokens."""
        return self.runtime.kv_meta.kept + count <= self.config.max_all_tokens

    def generate(self, ids, max_new_tokens: int | None = None, on_token=None, stop_ids=None) -> list[int]:
        """New ids after `ids`, until a stop id or max_new_tokens (the config's when None).

        The stop ids are the tokenizer's, as in MNN, unless `stop_ids` names others (`()`: none,
        running on past them as llm_bench does)."""
        self._require_loaded()
        limit = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0:
            raise InputError(f"expected a non-negative integer, got {limit!r}", field="max_new_tokens")
        prompt_ids = self._check_ids(ids)
        history = list(self.context.history_tokens) + prompt_ids
        reused = self._reuse_stored_prefix(prompt_ids)
        timing = {"prefill": True, "t": time.perf_counter()}
        ctx = self.context

        def timed(run):
            def call(step_ids: list[int]) -> np.ndarray:
                logits = run(step_ids)
                now = time.perf_counter()
                key = "prefill_us" if timing["prefill"] else "decode_us"
                setattr(ctx, key, getattr(ctx, key) + int((now - timing["t"]) * 1e6))
                timing.update(prefill=False, t=now)
                return logits
            return call

        forward = timed(self._last_logits)
        verify = timed(lambda block: self._finite(np.asarray(self.verify(block))[0]))

        def sample(logits: np.ndarray) -> int:
            token = int(self.sampler.sample(logits, history))
            history.append(token)
            return token

        def is_stop(token: int) -> bool:
            return self.tokenizer.is_stop(token) if stop_ids is None else token in stop_ids

        def on_new_token(token: int) -> bool:
            stop = bool(on_token(token)) if on_token is not None else False
            # like MNN, a reply ends at max_all_tokens; `history` is the cache once this token is in it
            return stop or len(history) > self.config.max_all_tokens

        ctx.prompt_len = len(prompt_ids)
        ctx.prefix_cached = reused
        ctx.gen_seq_len = 0
        steps = DecodeSteps(forward, sample, is_stop, history, on_new_token, verify, self.discard,
                            self._room_left, self.tokenizer, self.hidden_states)
        result = self.strategy.generate(steps, prompt_ids[reused:], int(limit))
        out = result.tokens
        if out and not result.ended_on_stop_id and self._room_left():
            forward([out[-1]])  # as in MNN, every emitted token enters the KV cache; only a stop id does not
        ctx.gen_seq_len = len(out)
        ctx.output_tokens = list(out)
        return out

    def response(self, prompt, stream: bool = False, max_new_tokens: int | None = None, out=None) -> str:
        """Reply to a user prompt (str or chat messages), applying the chat template when use_template."""
        self._require_loaded()
        if not self.config.reuse_kv:
            self.reset()
        text = self.prompt.apply_chat_template(prompt) if self.config.use_template else prompt
        decoder = self.tokenizer.stream_decoder()
        out = out or sys.stdout
        pieces: list[str] = []

        def on_token(token: int) -> None:
            piece = decoder.feed(token)
            pieces.append(piece)
            if stream and piece:
                out.write(piece)
                out.flush()

        self.generate(self.tokenizer_encode(text), max_new_tokens, on_token)
        tail = decoder.flush()
        pieces.append(tail)
        if stream:
            out.write(tail + "\n")
            out.flush()
        return "".join(pieces)


__all__ = ["Llm", "LlmContext", "Logits", "graph_feeds"]
