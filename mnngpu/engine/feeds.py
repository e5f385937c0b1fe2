"""The graph's inputs for one run: embedding rows, positions, the attention mask, the per-layer
embedding and a subclass's extra feeds (Omni overrides the hooks); placement feeds the same."""

from __future__ import annotations

import numpy as np

from mnngpu.runtime.attention_mask import mask_feed
from mnngpu.runtime.placement import PlacementTable
from mnngpu.runtime.validate import PLE_FEED

CAUSAL_MASK = mask_feed("full", 0)

def graph_feeds(embeds: np.ndarray, first_position: int, all_logits: bool,
                mask: np.ndarray = CAUSAL_MASK, positions: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The graph inputs for `embeds` [rows, 1, hidden] at positions from `first_position`, or at
    `positions` [axes, rows] (an mrope graph takes three rows: time, height, width); `mask` is the
    model's attention_mask feed (runtime.attention_mask.mask_feed)."""
    rows = embeds.shape[0]
    if positions is None:
        positions = (first_position + np.arange(rows, dtype=np.int32)).reshape(1, rows)
    return {"input_ids": embeds, "attention_mask": mask,
            "position_ids": positions, "logits_index": np.array([0 if all_logits else -1], dtype=np.int32)}


class LlmFeeds:
    """What a module forward is fed. Uses the state load() sets: config, embedding,
    per_layer_embedding, attention_mask, position_axes, pool and runtime; owns none."""

    def placement(self) -> PlacementTable:
        """Where every op runs, for the prefill and the decode module's shapes (decided, not resized)."""
        self._require_loaded()
        for (_, rows, all_logits), module in self.pool.modules.items():
            embeds = np.zeros((rows, 1, self.config.hidden_size), dtype=np.float32)
            module.session.place(graph_feeds(embeds, 0, all_logits, self.attention_mask,
                                             self._positions(0, 0, rows)) | self._extra_feeds(rows)
                                 | self._ple_feed([], rows))
        return self.runtime.placements

    def _embed(self, ids: list[int]) -> np.ndarray:
        """The input rows [seq, hidden] of `ids` (Omni puts its images' rows in)."""
        return self.embedding.rows(ids)

    def _extra_feeds(self, rows: int) -> dict[str, np.ndarray]:
        """Graph inputs beyond FEEDS for a run of `rows` rows (Omni: Qwen3-VL's deepstack_embeds)."""
        return {}

    def _ple_feed(self, ids: list[int], rows: int) -> dict[str, np.ndarray]:
        """Gemma 4's ple_embeddings [1, rows, ple_embed_dim]: the per-layer rows of `ids`, zero rows after
        them (the padding of a fixed-shape run); none for a model without per-layer embeddings."""
        if self.per_layer_embedding is None:
            return {}
        return {PLE_FEED: self.per_layer_embedding.rows(ids, rows)}

    def _positions(self, first: int, seq: int, rows: int) -> np.ndarray:
        """int32 [axes, rows]: positions first.. on every axis (an mrope graph's three agree for text)."""
        return np.tile(first + np.arange(rows, dtype=np.int32), (self.position_axes, 1))
