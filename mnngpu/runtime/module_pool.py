"""ModulePool: the prefill, decode and verify modules an Llm switches between.

As in MNN: the prefill module is keyed (prefill_len, all_logits), the decode module is a
clone keyed (1, False), and a speculative strategy adds a verify clone keyed
(verify_length, True) that returns every row's logits. Clones share the packed weights and the
KV cache. A fixed-shape backend resizes each one once; prompts are then fed in chunks of
prefill_len, and a verify block is always verify_length ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# NetModule only names a type here: schedule.py reads PREFILL_LEN, and module.py imports schedule.
if TYPE_CHECKING:
    from mnngpu.runtime.module import NetModule

PREFILL_LEN = 100   # rows of a prefill chunk; schedule.py hands it to the backends (prefill_len)


class ModulePool:
    def __init__(self, prefill: NetModule, all_logits: bool, verify_length: int = 0):
        self.modules: dict[tuple[int, bool], NetModule] = {(PREFILL_LEN, all_logits): prefill,
                                                           (1, False): prefill.clone()}
        self.all_logits = all_logits
        self.verify_length = verify_length
        if verify_length:
            self.modules[(verify_length, True)] = prefill.clone()

    def select(self, seq_len: int, all_logits: bool) -> NetModule:
        if seq_len == 1 and not all_logits:
            return self.modules[(1, False)]
        key = (PREFILL_LEN, all_logits)
        if key not in self.modules:
            self.modules[key] = self.modules[(1, False)].clone()
        return self.modules[key]

    def rows(self, count: int) -> NetModule:
        """The module of a batched decode step of `count` rows (one per sequence), every row's
        logits: one clone per count, so each keeps its resized pipeline."""
        key = (count, True)
        if key not in self.modules:
            self.modules[key] = self.modules[(1, False)].clone()
        return self.modules[key]

    def verify(self) -> NetModule:
        return self.modules[(self.verify_length, True)]
