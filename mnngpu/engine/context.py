"""LlmContext: one sequence's history and counts (Llm.context is the current sequence's)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
