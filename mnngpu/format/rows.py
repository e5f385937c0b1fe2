"""Reading single rows of a row-quantized table: tied embeddings and embeddings_int4/int8.bin.

When embeddings are tied, no embedding file is written: llm_config.json's
`tie_embeddings` locates the lm_head's codes and alpha inside llm.mnn.weight, as
  [weight_offset, alpha_offset, alpha_bytes, bits, block]  (+ alpha_fp16 flag), or
  {"weight_offset", "alpha_offset", "alpha_size", "quant_bit", "quant_block", "alpha_dtype"}.
weight_offset 0 means the table is a separate embeddings_int{4,8}.bin with the same layout.
Row r's codes are the `hidden*bits/8` bytes at weight_offset + r*row_bytes; its alpha is
`n_blocks` scales (symmetric) or `n_blocks` [min, scale] pairs (asymmetric), told apart by
the alpha size. The value is code*scale + (min - 2^(bits-1)*scale), or
(code - 2^(bits-1))*scale when symmetric. bits 16 means fp16 rows and no alpha.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, InputError, WeightFileError
from .bits import split_nibbles, unpack_codes
from .quant import QuantizedLinear
from .weights import WeightFile


@dataclass(frozen=True)
class QuantizedRows:
    """Where a table of quantized rows lives in a file."""

    codes_offset: int
    alpha_offset: int
    alpha_bytes: int
    bits: int
    block_size: int  # 0 = one block per row
    row_length: int  # hidden size
    alpha_fp16: bool = False

    @classmethod
    def from_tie_embeddings(cls, value: Sequence[int] | dict, hidden_size: int, origin=None) -> QuantizedRows:
        """The layout from llm_config.json's `tie_embeddings` (list or dict form); `origin`: the
        config file that holds it, named in errors."""
        if isinstance(value, dict):
            keys = ("weight_offset", "alpha_offset", "alpha_size", "quant_bit", "quant_block")
            missing = [k for k in keys if k not in value]
            if missing:
                raise ConfigError(f"keys {missing} in the tie_embeddings object", path=origin,
                                  field="tie_embeddings")
            fields = [int(value[k]) for k in keys] + [value.get("alpha_dtype", "fp32") == "fp16"]
        elif len(value) >= 5:
            fields = [int(v) for v in value[:5]] + [len(value) > 5 and bool(value[5])]
        else:
            raise ConfigError("a list [weight_offset, alpha_offset, alpha_size, quant_bit, quant_block]",
                              path=origin, field="tie_embeddings")
        offset, alpha_offset, alpha_bytes, bits, block = fields[:5]
        if bits not in (1, 2, 3, 4, 5, 6, 7, 8, 16) or (hidden_size * bits) % 8:
            raise ConfigError(f"a bit width that packs hidden_size {hidden_size} into whole bytes, got {bits}",
                              path=origin, field="tie_embeddings")
        if block and hidden_size % block:
            raise ConfigError(f"a block size dividing hidden_size {hidden_size}, got {block}",
                              path=origin, field="tie_embeddings")
        return cls(offset, alpha_offset, alpha_bytes, bits, block, hidden_size, fields[5])

    @property
    def row_bytes(self) -> int:
        return self.row_length * self.bits // 8

    @property
    def n_rows(self) -> int:
        return (self.alpha_offset - self.codes_offset) // self.row_bytes

    @property
    def n_blocks(self) -> int:
        return self.row_length // self.block_size if self.block_size else 1


def read_quantized_rows(weights: WeightFile, layout: QuantizedRows | QuantizedLinear,
                        rows: Sequence[int] | np.ndarray) -> np.ndarray:
    """float32 [len(rows), row_length]: the dequantized rows `rows`, reading no other row."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if isinstance(layout, QuantizedLinear):
        _check_rows(rows, layout.oc)
        return layout.dequantize(rows)
    _check_rows(rows, layout.n_rows)
    table = weights.bytes(layout.codes_offset, layout.n_rows * layout.row_bytes, "tie_embeddings codes")
    packed = table.reshape(layout.n_rows, layout.row_bytes)[rows]
    if layout.bits == 16:
        return packed.view("<f2").astype(np.float32)
    codes = _unpack_rows(packed, layout.bits, layout.row_length).astype(np.float32)
    codes = codes.reshape(len(rows), layout.n_blocks, -1)
    with np.errstate(over="ignore", invalid="ignore"):  # damaged scales give inf/NaN; DiskEmbedding rejects those
        scales, zeros = _row_scales(weights, layout, rows)
        return (codes * scales[:, :, None] + zeros[:, :, None]).reshape(len(rows), layout.row_length)


def check_table_bounds(weights: WeightFile, layout: QuantizedRows) -> None:
    """Check, before any row is read, that the whole table and its alpha lie inside the file."""
    if layout.n_rows < 1:
        raise WeightFileError(f"alpha_offset {layout.alpha_offset} beyond weight_offset {layout.codes_offset} "
                              f"by at least one {layout.row_bytes}-byte row", path=weights.path,
                              field="tie_embeddings")
    weights.check(layout.codes_offset, layout.n_rows * layout.row_bytes, "tie_embeddings codes")
    if layout.bits != 16:
        _alpha_per_row(weights, layout)
        weights.check(layout.alpha_offset, layout.alpha_bytes, "tie_embeddings alpha")


def _check_rows(rows: np.ndarray, n_rows: int) -> None:
    bad = rows[(rows < 0) | (rows >= n_rows)]
    if bad.size:
        raise InputError(f"row ids in [0, {n_rows}), got {int(bad[0])}", field="token id")


def _unpack_rows(packed: np.ndarray, bits: int, row_length: int) -> np.ndarray:
    if bits == 8:
        return packed
    if bits == 4:
        return split_nibbles(packed)
    flat = unpack_codes(packed.reshape(-1), bits, packed.shape[0] * row_length)
    return flat.reshape(packed.shape[0], row_length)


def _alpha_per_row(weights: WeightFile, layout: QuantizedRows) -> tuple[str, int, int]:
    """(dtype, total count, count per row) of the alpha values; one scale or one pair per block."""
    dtype = "<f2" if layout.alpha_fp16 else "<f4"
    count = layout.alpha_bytes // np.dtype(dtype).itemsize
    per_row, rest = divmod(count, layout.n_rows) if layout.n_rows > 0 else (0, 1)
    if rest or per_row not in (layout.n_blocks, 2 * layout.n_blocks):
        raise WeightFileError(f"{layout.n_blocks} scales or [min, scale] pairs per row for {layout.n_rows} rows, "
                              f"got {count} alpha values", path=weights.path, field="tie_embeddings alpha")
    return dtype, count, per_row


def _row_scales(weights: WeightFile, layout: QuantizedRows, rows: np.ndarray):
    dtype, count, per_row = _alpha_per_row(weights, layout)
    alpha = weights.array(layout.alpha_offset, dtype, count, "tie_embeddings alpha")
    alpha = alpha.reshape(layout.n_rows, per_row)[rows].astype(np.float32)
    offset = np.float32(1 << (layout.bits - 1))
    if per_row == layout.n_blocks:
        return alpha, -offset * alpha
    low, scale = alpha[:, 0::2], alpha[:, 1::2]
    return scale, low - offset * scale
