"""DiskEmbedding: embedding rows read from disk on demand, never the whole table; and
PerLayerEmbedding, Gemma 4's second table of the same kind.

Three sources, as MNN's exporter writes them:
  * embeddings_bf16.bin: [vocab][hidden] raw bf16 (fp32 = bf16 << 16);
  * embeddings_int8.bin / embeddings_int4.bin, and tied models' lm_head rows inside
    llm.mnn.weight: both located by llm_config.json's `tie_embeddings` and decoded by
    mnngpu.format.rows (weight_offset 0 means the separate file).

Per-layer embeddings (Gemma 4): llm_config.json's `ple_embed_file` (ple_embeddings_bf16.bin) holds
raw bf16 rows [vocab][ple_embed_dim], each token's rows for every layer side by side. MNN reads a
prompt's rows, multiplies them by `ple_embed_scale` and feeds them to the graph's `ple_embeddings`
input [1, seq, ple_embed_dim] at every forward; the graph projects and mixes them per layer.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mnngpu.errors import InputError, WeightFileError
from mnngpu.format.rows import QuantizedRows, check_table_bounds, read_quantized_rows
from mnngpu.format.weights import WeightFile


class DiskEmbedding:
    def __init__(self, hidden_size: int, embedding_path: Path, weight_path: Path, tie_embeddings=None,
                 tie_origin=None):
        """`tie_origin`: the config file that holds tie_embeddings, named in its errors."""
        self.hidden = hidden_size
        self.layout = (QuantizedRows.from_tie_embeddings(tie_embeddings, hidden_size, tie_origin)
                       if tie_embeddings else None)
        if self.layout is None:
            self.path = Path(embedding_path)
            self._bf16 = self._map_bf16(self.path, hidden_size)
            self.vocab_size = self._bf16.shape[0]
        else:
            self.path = Path(weight_path if self.layout.codes_offset else embedding_path)
            self._weights = WeightFile(self.path)
            self.vocab_size = self.layout.n_rows
            check_table_bounds(self._weights, self.layout)

    @staticmethod
    def _map_bf16(path: Path, hidden_size: int) -> np.ndarray:
        if not path.is_file():
            raise WeightFileError("embedding file is missing", path=path)
        size = os.path.getsize(path)
        if size == 0 or size % (2 * hidden_size):
            raise WeightFileError(f"size {size} bytes is not a whole number of bf16 rows of hidden_size "
                                  f"{hidden_size}", path=path)
        return _map_rows(path, hidden_size)

    def rows(self, ids) -> np.ndarray:
        """float32 [len(ids), hidden] for the given token ids."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self.layout is not None:
            rows = read_quantized_rows(self._weights, self.layout, ids)
        else:
            bad = ids[(ids < 0) | (ids >= self.vocab_size)]
            if bad.size:
                raise InputError(f"token id {int(bad[0])} is outside the vocabulary [0, {self.vocab_size})",
                                 field="input_ids")
            rows = _bf16_rows(self._bf16, ids)
        _check_finite(ids, rows, self.path, "embedding")
        return rows


def _check_finite(ids: np.ndarray, rows: np.ndarray, path: Path, table: str) -> None:
    """A NaN or infinite value in a row is damage; it would turn every logit into NaN."""
    bad = ~np.isfinite(rows).all(axis=1)
    if bad.any():
        raise WeightFileError(f"finite values in the {table} row of token {int(ids[bad][0])}", path=path,
                              field="rows")


def _map_rows(path: Path, width: int) -> np.ndarray:
    """A bf16 table file mapped (not read) as uint16 [rows, width]."""
    try:
        return np.memmap(path, dtype=np.uint16, mode="r").reshape(-1, width)
    except OSError as err:
        raise WeightFileError(f"a readable embedding file ({err.strerror})", path=path) from None


def _bf16_rows(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """float32 rows of a mapped bf16 table (fp32 = bf16 << 16)."""
    return (table[ids].astype(np.uint32) << 16).view(np.float32)


PLE_KEY = "ple_embed_file"


class PerLayerEmbedding:
    """Gemma 4's per-layer embedding rows (the graph's `ple_embeddings` input), read on demand."""

    def __init__(self, path: Path, width: int, scale: float, vocab_size: int, origin=None):
        """`width`: ple_embed_dim; `vocab_size`: the main embedding's rows, which this table must
        match; `origin`: the config file that sets ple_embed_file, named in its errors."""
        self.path, self.width, self.scale = Path(path), width, float(scale)
        if not self.path.is_file():
            where = f" in {origin}" if origin else ""
            raise WeightFileError(f"missing: the per-layer embedding file that {PLE_KEY}{where} names",
                                  path=self.path, field=PLE_KEY)
        expected = vocab_size * width * 2
        size = os.path.getsize(self.path)
        if size != expected:
            raise WeightFileError(f"expected {expected} bytes (bf16 rows [{vocab_size} tokens][ple_embed_dim {width}]), "
                                  f"got {size}", path=self.path, field=PLE_KEY)
        self._bf16 = _map_rows(self.path, width)

    def rows(self, ids, count: int | None = None) -> np.ndarray:
        """float32 [1, count, width]: the scaled rows of `ids`, then zero rows up to `count` (a
        fixed-shape backend's padding). The ids are checked against the vocabulary by the caller."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        feed = np.zeros((1, len(ids) if count is None else count, self.width), dtype=np.float32)
        rows = _bf16_rows(self._bf16, ids) * np.float32(self.scale)
        _check_finite(ids, rows, self.path, "per-layer embedding")
        feed[0, : len(ids)] = rows
        return feed
