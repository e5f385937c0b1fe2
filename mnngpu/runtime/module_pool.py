"""ModulePool: the prefill and decode modules an Llm switches between.

As in MNN: the prefill module is keyed (prefill_len, all_logits) and the decode module is a
clone keyed (1, False), sharing the packed weights and the KV cache. A fixed-shape backend
resizes each one once; prompts are then fed in chunks of prefill_len.
"""

from __future__ import annotations

from mnngpu.runtime.module import NetModule

PREFILL_LEN = 100


class ModulePool:
    def __init__(self, prefill: NetModule, all_logits: bool):
        self.modules: dict[tuple[int, bool], NetModule] = {(PREFILL_LEN, all_logits): prefill,
                                                           (1, False): prefill.clone()}
        self.all_logits = all_logits

    def select(self, seq_len: int, all_logits: bool) -> NetModule:
        if seq_len == 1 and not all_logits:
            return self.modules[(1, False)]
        key = (PREFILL_LEN, all_logits)
        if key not in self.modules:
            self.modules[key] = self.modules[(1, False)].clone()
        return self.modules[key]
