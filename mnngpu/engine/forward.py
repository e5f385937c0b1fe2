"""The forward pass: ids checked, cut into prefill chunks, run through the module pool over the
KV cache; verify and discard for a speculative block; the hidden_states a strategy reads."""

from __future__ import annotations

import itertools

import numpy as np

from mnngpu.backend.widths import PREFILL_LEN
from mnngpu.engine.feeds import graph_feeds
from mnngpu.errors import InputError, MnnGpuError


class Logits(np.ndarray):
    """float32 logits that also answer MNN's `Var.read()`, so code written for MNN runs as is."""

    def read(self) -> np.ndarray:
        return np.asarray(self)


def _chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i: i + size] for i in range(0, len(ids), size)]


class LlmForward:
    """Module forwards over the KV cache. Owns `_verified` (the last verify block, until discard())
    and `_hidden_parts` (hidden_states rows of the last forward or verify); uses config, runtime
    (kv_meta, fixed_shape), pool, strategy, embedding and context."""

    # ---- the forward pass --------------------------------------------------------------------
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
