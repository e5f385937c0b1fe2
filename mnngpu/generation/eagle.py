"""EAGLE: a one-layer draft head guesses the next tokens from the base model's hidden states, and
one verify forward checks them (MNN's EagleGeneration, with eagle_topk 1).

Each step verifies [current token, draft_1 .. draft_n] exactly as lookahead does
(`steps.verify_block`); the draft head then reads the kept rows' hidden states with the tokens
that followed them, and drafts again.

MNN takes each row's argmax here whatever the sampler; mnngpu samples each row with the
configured sampler, so with greedy sampling the two pick the same tokens, and with any sampler
the reply is AR's.
"""

from __future__ import annotations

from mnngpu.generation.eagle_draft import EagleDraft
from mnngpu.generation.steps import DecodeSteps, GenerationStats, Output, verify_block


class EagleGeneration:
    name = "eagle"
    needs_hidden_states = True

    def __init__(self, draft_length: int, draft: EagleDraft):
        self.draft_length = draft_length
        self.verify_length = draft_length + 1
        self.draft = draft
        self.stats = GenerationStats()

    def generate(self, steps: DecodeSteps, prompt_ids: list[int], max_new_tokens: int) -> Output:
        self.stats = stats = GenerationStats()
        out = Output(steps, max_new_tokens)
        if max_new_tokens <= 0:
            return out
        self.draft.reset()
        logits = steps.forward(prompt_ids)
        fed, hidden = prompt_ids, steps.hidden()
        ended = out.take(steps.sample(logits))
        while not ended:
            current = out.tokens[-1]
            drafts = self.draft.propose(fed[1:] + [current], hidden, self.draft_length)
            stats.decode_forwards += 1
            if drafts and steps.fits(self.verify_length):
                ended, fed = self._verify_step(steps, out, [current] + drafts, len(drafts))
            else:
                stats.decode_tokens += 1
                ended, fed = out.take(steps.sample(steps.forward([current]))), [current]
            hidden = steps.hidden()[: len(fed)]
        return out

    def _verify_step(self, steps: DecodeSteps, out: Output, block: list[int], drafted: int):
        """One verify forward; returns whether the reply ended and the block's ids that stay cached."""
        ended, kept = verify_block(steps, out, block, self.verify_length)
        self.stats.decode_tokens += kept
        self.stats.drafted += drafted
        self.stats.accepted += min(kept - 1, drafted)
        return ended, block[:kept]
