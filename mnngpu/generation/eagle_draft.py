"""EagleDraft: the EAGLE-3 draft head that `llmexport --eagle_path` writes, run on its own runtime.

Three files beside llm.mnn: eagle_fc.mnn maps the base model's hidden_states output (three of
its layers' inputs, concatenated) to the draft layer's width; eagle.mnn is one decoder layer that
reads a token's embedding with a hidden state and returns log-probabilities over the draft
vocabulary and its own output hidden state; eagle_d2t.mnn maps a draft id d to the target id
d + d2t[d]. The layer has its own KV cache (its own KVMeta, as MNN gives it).

`propose` follows MNN's EagleGeneration::topkGenerate with eagle_topk 1, where the token tree is
a chain: one forward over the new (token, hidden) pairs, then eagle_depth - 1 forwards of one
token each, each feeding the last drafted token with the layer's own output hidden state. Those
depth - 1 entries leave the draft's cache again before the next call, as MNN removes them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mnngpu.config import LlmConfig
from mnngpu.errors import ModelFormatError
from mnngpu.format import read_net
from mnngpu.runtime.attention_mask import mask_feed
from mnngpu.runtime.module import Module, ModuleConfig, NetModule
from mnngpu.runtime.placement import PlacementTable
from mnngpu.runtime.schedule import RuntimeManager

LAST_ROW, ALL_ROWS = np.array([-1], dtype=np.int32), np.array([0], dtype=np.int32)


def read_d2t(path: Path, vocab_size: int) -> np.ndarray:
    """eagle_d2t.mnn: one int32 constant, draft id -> offset to the target id; every target id
    must be in the base model's vocabulary."""
    consts = [op for op in read_net(path).ops if op.type == "Const"]
    values = consts[0].param.int32s if len(consts) == 1 else None
    if values is None or len(values) == 0:
        raise ModelFormatError("expected one int32 constant (d2t: draft id -> target id offset)", path=path)
    d2t = np.asarray(values, dtype=np.int64)
    targets = np.arange(d2t.size) + d2t
    bad = np.flatnonzero((targets < 0) | (targets >= vocab_size))
    if bad.size:
        raise ModelFormatError(f"d2t maps draft id {bad[0]} to {targets[bad[0]]}, outside the vocabulary "
                               f"[0, {vocab_size})", path=path)
    return d2t


def _input_dims(module: NetModule, name: str) -> list[int]:
    for op in module.pipeline_module.static_module.net.ops:
        if op.type == "Input" and op.name == name:
            return [int(d) for d in op.param.dims]
    return []


class EagleDraft:
    def __init__(self, fc: NetModule, layer: NetModule, runtime: RuntimeManager, d2t: np.ndarray,
                 embed, depth: int, fc_path: Path, d2t_path: Path):
        self.fc, self.layer, self.runtime, self.d2t = fc, layer, runtime, d2t
        self.fc_path, self.d2t_path = fc_path, d2t_path
        self.fc_width = _input_dims(fc, "fc_hidden")[-1]
        # only the export's `presents` output reads past_key_values (the Attention op keeps the
        # cache itself), so an empty one does
        self.past_feed = np.zeros([max(0, d) for d in _input_dims(layer, "past_key_values")], dtype=np.float32)
        self.embed = embed   # ids -> embedding rows [n, hidden], the base model's
        self.depth = depth
        self.length = 0      # draft cache positions that stay (the chain's do not)
        self.chain = 0       # entries the last chain left in the draft cache

    @classmethod
    def load(cls, config: LlmConfig, embedding, placements: PlacementTable | None = None) -> EagleDraft:
        """The three draft files on a runtime of the base model's settings, with its own KV cache;
        `embedding`: the base model's DiskEmbedding, whose rows the draft layer reads;
        `placements`: the base model's table, where the draft's ops are placed at load too, so the
        ready line counts their fallbacks (and strict_device refuses them) before the first token."""
        runtime = RuntimeManager.from_config(config)
        runtime.kv_meta.attn_scale = 0.0   # the base model's attn_scale is not the draft layer's
        if placements is not None:
            runtime.placements = placements
        module_config = ModuleConfig(shape_mutable=True, rearrange=True)
        fc, layer = (Module.load(path, path.with_name(path.name + ".weight"), module_config, runtime)
                     for path in (config.eagle_fc_path, config.eagle_model_path))
        d2t = read_d2t(config.eagle_d2t_path, embedding.vocab_size)
        draft = cls(fc, layer, runtime, d2t, embedding.rows, config.eagle_depth, config.eagle_fc_path,
                    config.eagle_d2t_path)
        draft._place()
        return draft

    def _place(self) -> None:
        width = _input_dims(self.layer, "hidden_states")[-1]
        self.fc.session.place({"fc_hidden": np.zeros((1, 1, self.fc_width), dtype=np.float32)})
        self.layer.session.place(self._feeds(np.zeros((1, 1, width), dtype=np.float32),
                                             np.zeros((1, 1, width), dtype=np.float32), 0, LAST_ROW))

    def reset(self) -> None:
        """Forget the draft cache: each reply starts the draft's positions at 0, as MNN's does."""
        self.runtime.kv_meta.clear()
        self.length = self.chain = 0

    def propose(self, tokens: list[int], hidden: np.ndarray, count: int) -> list[int]:
        """Up to `count` draft ids to follow `tokens[-1]`. `tokens` are the ids that follow the
        base model's last forward rows and `hidden` those rows' hidden_states [n, width]: token i
        is what the base model chose after row i."""
        if hidden.shape[-1] != self.fc_width:
            raise ModelFormatError(f"takes hidden states {self.fc_width} wide, but llm.mnn's hidden_states rows are "
                                   f"{hidden.shape[-1]} wide (llmexport taps three distinct layers, 2, n//2 and n-3, "
                                   "only for 7 or more layers)", path=self.fc_path)
        self.runtime.kv_meta.remove += self.chain
        (fed,) = self.fc.forward({"fc_hidden": hidden.reshape(1, len(tokens), -1)}, ["hidden_states"])
        scores, state = self._layer(tokens, np.asarray(fed), self.length, LAST_ROW)
        self.length += len(tokens)
        drafts, cumulative = [], []
        for step in range(self.depth):
            pick = int(np.argmax(scores))
            drafts.append(pick + int(self.d2t[pick]))
            cumulative.append((cumulative[-1] if cumulative else 0.0) + float(scores[pick]))
            if step + 1 < self.depth:
                scores, state = self._layer(drafts[-1:], state, self.length + step, ALL_ROWS)
        self.chain = self.depth - 1
        return drafts[: _kept_prefix(cumulative, count)]

    def _layer(self, tokens: list[int], hidden: np.ndarray, first: int, rows: np.ndarray):
        """One forward of the draft layer: (log-probabilities of the last row, its hidden state)."""
        count = len(tokens)
        feeds = self._feeds(self.embed(tokens).reshape(count, 1, -1), hidden, first, rows)
        meta = self.runtime.kv_meta
        meta.add = count
        scores, state = self.layer.forward(feeds, ["logits", "out_hidden_states"])
        meta.sync()
        scores = np.asarray(scores, dtype=np.float32)
        if scores.shape[-1] != self.d2t.size:
            raise ModelFormatError(f"holds {self.d2t.size} draft ids, but eagle.mnn scores {scores.shape[-1]}",
                                   path=self.d2t_path)
        return scores.reshape(-1, scores.shape[-1])[-1], np.asarray(state, dtype=np.float32)[:, -1:]

    def _feeds(self, embeds: np.ndarray, hidden: np.ndarray, first: int, rows: np.ndarray) -> dict[str, np.ndarray]:
        count = embeds.shape[0]
        return {"input_embed": embeds, "hidden_states": hidden, "attention_mask": mask_feed("full", 0),
                "position_ids": (first + np.arange(count, dtype=np.int32)).reshape(1, count),
                "logits_index": rows, "past_key_values": self.past_feed}


def _kept_prefix(cumulative: list[float], count: int) -> int:
    """How many chain tokens MNN's TokenTree.finalize keeps as a chain: it keeps the `count`
    nodes of highest cumulative log-probability (ties: the earlier node), and a node whose parent
    was dropped no longer follows the chain."""
    order = sorted(range(len(cumulative)), key=lambda i: (-cumulative[i], i))
    kept = set(order[:count])
    length = 0
    while length in kept:
        length += 1
    return length
