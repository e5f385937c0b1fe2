"""Lookahead: draft the next tokens by n-gram lookup, verify them in one forward (MNN's
LookaheadGeneration).

Each step feeds [current token, draft_1 .. draft_n] (padded with id 0 to verify_length, the
verify module's fixed size) and samples every row in order: row r's token is exactly what AR
would sample after the first r+1 ids, so while it equals draft r+1 the next row is valid too.
The cache keeps the rows up to the last one sampled; the rest are removed before the next forward.
With no n-gram match the step is a plain one-token decode.
"""

from __future__ import annotations

from pathlib import Path

from mnngpu.generation.ngram import NgramTable
from mnngpu.generation.steps import DecodeSteps, GenerationStats, Output, verify_block

# After one of these pieces a match is often a coincidence, so the first draft token needs
# the "high" share (MNN's list: ASCII and full-width punctuation).
AMBIGUOUS_PIECES = frozenset({",", ".", ":", ";", "、", "，", "。", "：", "；"})


class LookaheadGeneration:
    name = "lookahead"
    needs_hidden_states = False

    def __init__(self, draft_length: int, max_key_len: int, strictness: str, rule: str, update: bool,
                 lookup_file: Path | None):
        self.draft_length = draft_length
        self.verify_length = draft_length + 1
        self.max_key_len = max_key_len
        self.strictness = strictness
        self.rule = rule
        self.update = update
        self.lookup_file = lookup_file
        self._lookup_ids: list[int] | None = None
        self.stats = GenerationStats()

    def _table(self, steps: DecodeSteps) -> NgramTable:
        table = NgramTable(self.max_key_len, self.rule)
        table.add(steps.history)
        if self.lookup_file is not None:
            if self._lookup_ids is None:
                self._lookup_ids = steps.tokenizer.encode(self.lookup_file.read_text(encoding="utf-8"))
            table.add(self._lookup_ids)
        return table

    def _strictness(self, steps: DecodeSteps, token: int) -> str:
        if self.strictness == "high" or steps.tokenizer is None:
            return self.strictness
        return "high" if steps.tokenizer.decode(token) in AMBIGUOUS_PIECES else self.strictness

    def generate(self, steps: DecodeSteps, prompt_ids: list[int], max_new_tokens: int) -> Output:
        self.stats = stats = GenerationStats()
        out = Output(steps, max_new_tokens)
        if max_new_tokens <= 0:
            return out
        table = self._table(steps)
        indexed = len(steps.history)
        ended = out.take(steps.sample(steps.forward(prompt_ids)))
        while not ended:
            current = out.tokens[-1]
            drafts = table.draft(steps.history, self.draft_length, self._strictness(steps, current))
            stats.decode_forwards += 1
            if drafts and steps.fits(self.verify_length):
                ended = self._verify_step(steps, out, [current] + drafts)
            else:
                stats.decode_tokens += 1
                ended = out.take(steps.sample(steps.forward([current])))
            if self.update:
                table.add(steps.history, indexed)
                indexed = len(steps.history)
        return out

    def _verify_step(self, steps: DecodeSteps, out: Output, block: list[int]) -> bool:
        """One verify forward; returns whether the reply ended."""
        ended, kept = verify_block(steps, out, block, self.verify_length)
        self.stats.decode_tokens += kept
        self.stats.drafted += self.draft_length
        self.stats.accepted += kept - 1
        return ended
