"""The generation API: text to tokens and back, the chat template, reset, generate and response
(the strategy's DecodeSteps over forward, verify and the sampler)."""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np

from mnngpu.engine.context import LlmContext
from mnngpu.errors import InputError, ModelFormatError
from mnngpu.generation.steps import DecodeSteps


class LlmGeneration:
    """Tokens, reset, generate, response. Uses tokenizer, prompt, sampler, strategy, config and
    runtime; writes the current context's history, counts and timings; reset() clears the KV
    cache, `_verified` and the context."""

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

    # ---- the sequence's state -----------------------------------------------------------------
    def reset(self) -> None:
        """Forget the KV cache, the recurrent state (backend.kv.state_step: the next forward keeps no
        token, so it starts from zero state) and the history."""
        if self._loaded:
            self.runtime.kv_meta.clear()
        self._verified = []
        self.context = LlmContext(load_us=self.context.load_us)

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
