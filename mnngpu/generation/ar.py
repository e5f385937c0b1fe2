"""Autoregressive generation: one token per forward (MNN's ArGeneration)."""

from __future__ import annotations

from mnngpu.generation.steps import DecodeSteps, GenerationStats, Output


class ArGeneration:
    name = "ar"
    verify_length = 0   # AR needs no verify module in the pool
    needs_hidden_states = False

    def __init__(self) -> None:
        self.stats = GenerationStats()

    def generate(self, steps: DecodeSteps, prompt_ids: list[int], max_new_tokens: int) -> Output:
        """Prefill `prompt_ids`, then decode until the Output ends. The last token returned is
        not in the KV cache yet (every other one is)."""
        self.stats = GenerationStats()
        out = Output(steps, max_new_tokens)
        if max_new_tokens <= 0:
            return out
        logits = steps.forward(prompt_ids)
        while not out.take(steps.sample(logits)):
            logits = steps.forward([out.tokens[-1]])
            self.stats.decode_forwards += 1
            self.stats.decode_tokens += 1
        return out
