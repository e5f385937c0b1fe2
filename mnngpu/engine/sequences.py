"""Several sequences in one model (mnngpu.generation.batch): each its own KV cache, recurrent
states and context; decode_rows runs one token of each in a single forward."""

from __future__ import annotations

import numpy as np

from mnngpu.backend.kv import Segment, Sequence
from mnngpu.engine.context import LlmContext
from mnngpu.engine.feeds import graph_feeds
from mnngpu.errors import InputError, MnnGpuError


class LlmSequences:
    """The sequences of runtime (RuntimeManager.sequence and its kin), each carrying its LlmContext
    as `sequence.context`; uses batch_width, config, pool and the feeds. use_sequence switches
    `_context`, `_verified` and `_hidden_parts` to the new current sequence."""

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
