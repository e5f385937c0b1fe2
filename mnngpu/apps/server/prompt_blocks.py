"""PromptBlocks: the server's prompt cache across requests and slots (`cache_ram` MiB, `--cache-ram`).

Before a slot's empty sequence prefills a prompt, the whole blocks of its start that any earlier
request computed (mnngpu/engine/block_cache.py) are copied into the slot's KV cache, and the
blocks still missing are prefilled here, on the batch's stepping thread between steps, then
stored for the next request. The Batch then prefills only the prompt's last part. A request
whose missing blocks another request is computing now waits for them, so clients that arrive
together with one system prompt prefill it once.

The blocks are copied into each slot, not shared in place: a slot's KV cache is one contiguous
region per layer (on the GPUs a region of a pool the recorded commands bind), so a block cannot
sit in several slots at once. The copy is a memory copy, far cheaper than the prefill it saves.
The budget counts the host memory the blocks hold; the slots' own caches are apart from it.

A model with recurrent layers (LinearAttention) resumes only from a block with a state
checkpoint: its missing blocks are prefilled in pieces of CHECKPOINT_BLOCKS blocks, each piece's
end stored with the layers' state, so a prompt that shares the start of another resumes from the
last checkpoint inside the shared part.
"""

from __future__ import annotations

from collections.abc import Callable

from mnngpu.backend import backend_class
from mnngpu.engine.block_cache import (
    BLOCK_TOKENS,
    MIB,
    Block,
    BlockCache,
    chain_hashes,
    joined_layers,
    reusable_blocks,
    split_blocks,
)
from mnngpu.errors import ConfigError

CHECKPOINT_BLOCKS = 4   # a recurrent model's state checkpoint every this many blocks

RunOnSequence = Callable[[Callable[[], object]], object]   # runs fn with the slot's sequence current


def declined(llm) -> str | None:
    """Why the prompt cache cannot serve `llm`, or None where it can."""
    backend = llm.config.backend_type
    if not backend_class(backend).caps.kv_transfer:
        return f"the {backend} backend cannot read its KV cache back (kv_transfer)"
    if llm.config.get("is_visual") or llm.config.get("is_audio"):
        return "a multimodal prompt's image and audio rows are not named by its token ids"
    return None


class PromptBlocks:
    def __init__(self, llm, budget_mib: int):
        self.llm = llm
        self.cache = BlockCache(budget_mib * MIB, needs_states=llm.has_recurrent_layers)

    @classmethod
    def for_model(cls, llm) -> PromptBlocks | None:
        """The model's prompt cache where its config's cache_ram is above 0; ConfigError where the
        model or backend cannot have one."""
        mib = llm.config.get("cache_ram") or 0
        if not mib:
            return None
        why = declined(llm)
        if why:
            raise ConfigError(f"{why}: the prompt cache is not available; set 0", field="cache_ram")
        return cls(llm, int(mib))

    def prefill(self, ids: list[int], run: RunOnSequence) -> tuple[int, int]:
        """Put the whole blocks of `ids` (all but its last id) into the slot's empty sequence: the
        cached ones copied, the rest prefilled and stored. Returns (tokens copied from the cache,
        tokens the sequence holds now); the caller prefills ids from the second on."""
        blocks = reusable_blocks(len(ids))
        names = chain_hashes(ids, blocks)
        found, claim = self._found_and_claim(names)
        cached = len(found) * BLOCK_TOKENS
        try:
            if found:
                run(lambda: self.llm.write_prefix(ids[:cached], joined_layers(found), found[-1].states or {}))
            if claim is not None:
                self._compute(ids, names, len(found), run)
        finally:
            if claim is not None:
                self.cache.release(claim)
        self.cache.count(len(ids), cached)
        return cached, blocks * BLOCK_TOKENS

    def _found_and_claim(self, names: list[bytes]):
        """The cached blocks `names` start with, and a claim on the rest (None: nothing missing);
        waits while another request computes any of the missing ones."""
        while True:
            found = self.cache.lookup(names)
            missing = names[len(found):]
            if not missing:
                return found, None
            claim = self.cache.claim(missing)
            if claim is not None:
                return found, claim
            self.cache.wait_for(missing)

    def _compute(self, ids: list[int], names: list[bytes], first: int, run: RunOnSequence) -> None:
        """Prefill blocks first .. len(names) - 1 piece by piece (each piece a step of its own, so
        the other slots decode between them) and store each piece's blocks."""
        step = self._blocks_per_piece()
        for start in range(first, len(names), step):
            end = min(start + step, len(names))
            piece = ids[start * BLOCK_TOKENS: end * BLOCK_TOKENS]
            layers, states = run(lambda piece=piece, end=end: self._forward_and_read(piece, end))
            blocks = [Block(layers) for layers in split_blocks(layers, start, end - start)]
            if self.cache.needs_states:
                blocks[-1].states = states
            self.cache.store(names[start:end], blocks)

    def _forward_and_read(self, piece: list[int], end_block: int):
        self.llm.forward(piece, all_logits=False)
        return self.llm.read_prefix(end_block * BLOCK_TOKENS)

    def _blocks_per_piece(self) -> int:
        if self.cache.needs_states:
            return CHECKPOINT_BLOCKS
        rows = self.llm._rows_per_run(1 << 30)
        return max(rows // BLOCK_TOKENS, 1) if not self.llm.runtime.fixed_shape else 1 << 30
