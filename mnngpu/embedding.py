"""DiskEmbedding: embedding rows read from disk on demand, never the whole table.

Three sources, as MNN's exporter writes them:
  * embeddings_bf16.bin: [vocab][hidden] raw bf16 (fp32 = bf16 << 16);
  * embeddings_int8.bin / embeddings_int4.bin, and tied models' lm_head rows inside
    llm.mnn.weight: both located by llm_config.json's `tie_embeddings` and decoded by
    mnngpu.format.rows (weight_offset 0 means the separate file).
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
        try:
            return np.memmap(path, dtype=np.uint16, mode="r").reshape(-1, hidden_size)
        except OSError as err:
            raise WeightFileError(f"a readable embedding file ({err.strerror})", path=path) from None

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
            rows = (self._bf16[ids].astype(np.uint32) << 16).view(np.float32)
        self._check_finite(ids, rows)
        return rows

    def _check_finite(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """A NaN or infinite value in a row is damage; it would turn every logit into NaN."""
        bad = ~np.isfinite(rows).all(axis=1)
        if bad.any():
            raise WeightFileError(f"finite values in the embedding row of token {int(ids[bad][0])}",
                                  path=self.path, field="rows")
