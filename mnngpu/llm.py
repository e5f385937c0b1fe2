"""Llm: MNN's LLM flow in Python, readable top-down, and a drop-in for `MNN.llm`.

    llm = create("model_dir/config.json")     # LlmConfig: config.json ⊕ llm_config.json ⊕ context.json
    llm.set_config('{"backend_type": "cpu"}')
    llm.load()        # runtime, tokenizer, embedding, prompt, sampler, Module.load, ModulePool
    logits = llm.forward(llm.tokenizer_encode("hello"))   # KV cache kept between calls
    print(llm.response("hello"))
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from mnngpu.config import LlmConfig
from mnngpu.embedding import DiskEmbedding
from mnngpu.errors import InputError, MnnGpuError, ModelFormatError
from mnngpu.generation.factory import create_strategy
from mnngpu.generation.steps import DecodeSteps
from mnngpu.runtime.module import Module, ModuleConfig
from mnngpu.runtime.module_pool import PREFILL_LEN, ModulePool
from mnngpu.runtime.schedule import RuntimeManager
from mnngpu.validate import validate_model


def _chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i: i + size] for i in range(0, len(ids), size)]


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


def create(config_path: str | os.PathLike) -> "Llm":
    """An Llm for a model folder or its config.json (not loaded yet)."""
    return Llm(LlmConfig.load(config_path))


class Llm:
    def __init__(self, config: LlmConfig):
        self.config = config
        self.context = LlmContext()
        self._loaded = False
        self._tokenizer = None
        self._verified: list[int] = []   # the last verify block, until discard()

    # ---- configuration and loading ---------------------------------------------------------
    def set_config(self, overrides: str | dict) -> bool:
        self.config.set_config(overrides)
        return True

    def load(self, progress=None) -> None:
        """`progress(stage, done, total)`, when given, hears each load stage start and end."""
        report = progress or (lambda stage, done, total: None)
        start = time.perf_counter()
        cfg = self.config
        self.runtime = RuntimeManager.from_config(cfg)
        report("weights mapped", 0, 1)
        self.embedding = DiskEmbedding(cfg.hidden_size, cfg.embedding_path, cfg.weight_path, cfg.tie_embeddings)
        report("weights mapped", 1, 1)
        net = validate_model(cfg, self.embedding)
        from mnngpu.sampler import Sampler

        self._prompt = None
        self.sampler = Sampler(cfg.raw)
        self.strategy = create_strategy(cfg, net.output_names)
        module_config = ModuleConfig(shape_mutable=not self.runtime.fixed_shape, rearrange=True)
        report("weights packed", 0, 1)
        prefill = Module.load(cfg.model_path, cfg.weight_path, module_config, self.runtime, net=net)
        self.pool = ModulePool(prefill, cfg.all_logits, self.strategy.verify_length)
        report("weights packed", 1, 1)
        self._loaded = True
        self.context.load_us = int((time.perf_counter() - start) * 1e6)

    @property
    def tokenizer(self):
        """Loaded on first use, so a folder whose tokenizer is unreadable can still forward ids."""
        if self._tokenizer is None:
            from mnngpu.tokenizer import load_tokenizer

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

    def _require_loaded(self) -> None:
        if not self._loaded:
            raise MnnGpuError("call load() first")

    # ---- tokens ------------------------------------------------------------------------------
    def tokenizer_encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def tokenizer_decode(self, token: int) -> str:
        return self.tokenizer.decode(int(token))

    def apply_chat_template(self, messages) -> str:
        self._require_loaded()
        return self.prompt.apply_chat_template(messages)

    # ---- the forward pass --------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the KV cache and the history."""
        if self._loaded:
            self.runtime.kv_meta.clear()
        self._verified = []
        self.context = LlmContext(load_us=self.context.load_us)

    def _check_ids(self, ids) -> list[int]:
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
        total = self.runtime.kv_meta.kept + array.size
        if total > self.config.max_all_tokens:
            raise InputError(f"{total} tokens exceed max_all_tokens={self.config.max_all_tokens}",
                             field="max_all_tokens")
        return [int(i) for i in array]

    def _run(self, ids: list[int], all_logits: bool, verify: bool = False) -> np.ndarray:
        """One module forward over `ids` (at most one chunk; with `verify`, the verify module
        and all logits). Returns logits [seq, vocab] with all_logits, else the module's last row
        [1, vocab]. A fixed-shape backend pads a chunk to PREFILL_LEN rows; the padded rows' keys
        are overwritten later and never attended to, since KVMeta only adds the real count."""
        meta = self.runtime.kv_meta
        seq = len(ids)
        padded = self.runtime.fixed_shape and not verify and not (seq == 1 and not all_logits)
        rows = PREFILL_LEN if padded else seq
        module = self.pool.verify() if verify else self.pool.select(seq, all_logits)
        embeds = np.zeros((rows, 1, self.config.hidden_size), dtype=np.float32)
        embeds[:seq, 0] = self.embedding.rows(ids)
        positions = (meta.kept + np.arange(rows, dtype=np.int32)).reshape(1, rows)
        feeds = {"input_ids": embeds, "attention_mask": np.zeros((1, 1, 1, 1), dtype=np.float32),
                 "position_ids": positions, "logits_index": np.array([0 if all_logits else -1], dtype=np.int32)}
        meta.add = seq
        (logits,) = module.forward(feeds, ["logits"])
        meta.sync()
        logits = np.asarray(logits, dtype=np.float32).reshape(-1, logits.shape[-1])
        return logits[:seq] if all_logits else logits[-1:]

    def forward(self, ids) -> Logits:
        """Logits [1, 1, vocab] for the last position, or [1, seq, vocab] with all_logits."""
        self._require_loaded()
        ids = self._check_ids(ids)
        all_logits = self.config.all_logits
        if self.runtime.fixed_shape and not all_logits and len(ids) > 1:
            # In a padded chunk the last real row is not the last row. Prefill all but the last
            # token (the lm_head then runs on one padded row only), and take the last token's
            # logits from the decode module.
            for chunk in _chunks(ids[:-1], PREFILL_LEN):
                self._run(chunk, all_logits=False)
            logits = self._run(ids[-1:], all_logits=False)
        else:
            size = PREFILL_LEN if self.runtime.fixed_shape else len(ids)
            parts = [self._run(chunk, all_logits) for chunk in _chunks(ids, size)]
            logits = np.concatenate(parts, axis=0) if all_logits else parts[-1]
        self.context.history_tokens.extend(ids)
        self.context.all_seq_len = self.runtime.kv_meta.previous
        return np.ascontiguousarray(logits[None]).view(Logits)

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
        logits = self._run(ids, all_logits=True, verify=True)
        self._verified = ids
        self.context.all_seq_len = self.runtime.kv_meta.previous
        return np.ascontiguousarray(logits[None]).view(Logits)

    def discard(self, keep: int) -> None:
        """Keep only the first `keep` ids of the last verify block in the KV cache; the rest are
        removed (KVMeta remove) before the next forward, without reallocating the cache."""
        block = self._verified
        if not 0 < keep <= len(block):
            raise InputError(f"keep 1..{len(block)} ids of the verify block, got {keep}", field="keep")
        self.runtime.kv_meta.remove = len(block) - keep
        self.context.history_tokens.extend(block[:keep])
        self.context.all_seq_len = self.runtime.kv_meta.kept
        self._verified = []

    # ---- generation --------------------------------------------------------------------------
    def _finite(self, logits: np.ndarray) -> np.ndarray:
        if not np.isfinite(logits).all():
            raise ModelFormatError("the model computed non-finite logits (damaged weights?)",
                                   path=self.config.weight_path)
        return logits

    def _last_logits(self, ids: list[int]) -> np.ndarray:
        return self._finite(np.asarray(self.forward(ids))[0, -1])

    def _room_left(self, count: int = 1) -> bool:
        """Whether `count` more tokens fit in max_all_tokens."""
        return self.runtime.kv_meta.kept + count <= self.config.max_all_tokens

    def generate(self, ids, max_new_tokens: int | None = None, on_token=None, stop_ids: bool = True) -> list[int]:
        """New ids after `ids`, until a stop id or max_new_tokens (the config's when None).
        `stop_ids=False` runs on past stop ids, as llm_bench does."""
        self._require_loaded()
        limit = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0:
            raise InputError(f"expected a non-negative integer, got {limit!r}", field="max_new_tokens")
        prompt_ids = self._check_ids(ids)
        history = list(self.context.history_tokens) + prompt_ids
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

        def on_new_token(token: int) -> bool:
            stop = bool(on_token(token)) if on_token is not None else False
            # like MNN, a reply ends at max_all_tokens; `history` is the cache once this token is in it
            return stop or len(history) > self.config.max_all_tokens

        is_stop = self.tokenizer.is_stop if stop_ids else (lambda token: False)
        steps = DecodeSteps(forward, sample, is_stop, history, on_new_token, verify, self.discard,
                            self._room_left, self.tokenizer)
        ctx.prompt_len = len(prompt_ids)
        ctx.gen_seq_len = 0
        result = self.strategy.generate(steps, prompt_ids, int(limit))
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


__all__ = ["Llm", "LlmContext", "Logits", "create"]
