"""The attention_mask feed, and the key window each Attention op reads from it.

MNN's runtime feeds a float mask of 0 / lowest per (query, key); mnngpu's Attention ops mask
causally themselves from how many tokens the cache holds, so the feed carries only what a mask
adds to that: its key window, 0 for none. A query at cache position p then sees the keys at
positions p - window < t <= p, as MNN's sliding mask lets it.

* attention_type full, and sliding: one causal mask, [1, 1, 1, 1] of 0. MNN's runtime builds
  the plain causal mask for sliding too (only mix gets a windowed one), so a sliding export runs
  unwindowed there and here alike (`sliding_unwindowed_note`).
* attention_type mix: MNN's stack of two masks [2, 1, 1, seq, kv] (full, then sliding) becomes
  [2, 1, 1, 1, 1] of (0, sliding_window). The graph itself picks each layer's entry (a GatherV2
  by layer), as it picks the mask in MNN, so the per-layer choice stays the exporter's. The feed
  is a host input: that pick folds at resize and every Attention op knows its window then.
"""

from __future__ import annotations

import numpy as np


def mask_feed(attention_type: str, sliding_window: int) -> np.ndarray:
    """The attention_mask input for every forward of a model with this attention_type."""
    if attention_type == "mix":
        return np.array([0, sliding_window], dtype=np.float32).reshape(2, 1, 1, 1, 1)
    return np.zeros((1, 1, 1, 1), dtype=np.float32)


def sliding_unwindowed_note(attention_type: str, sliding_window: int) -> str | None:
    """The one line said at load when an export's sliding_window is not applied, as in MNN."""
    if attention_type != "sliding" or sliding_window <= 0:
        return None
    return (f"attention_type sliding: sliding_window {sliding_window} is not applied; MNN's runtime masks a "
            "sliding export causally (only mix gets a windowed mask), and mnngpu does as MNN does")
