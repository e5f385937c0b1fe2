"""DiskEmbedding: embedding rows read from disk on demand, never the whole table.

Three sources, as MNN's exporter writes them:
  * embeddings_bf16.bin: [vocab][hidden] raw bf16 (fp32 = bf16 << 16);
  * embeddings_int8.bin / embeddings_int4.bin, described by `tie_embeddings` with a zero
    weight offset: per row, hidden*bits/8 bytes of unsigned codes, high nibble first;
  * tied models: the same codes inside llm.mnn.weight (the lm_head's), at the offsets that
    `tie_embeddings` = [weight_offset, alpha_offset, alpha_size, bits, block(, alpha_fp16)] gives.
Quantized alpha is [zero, scale] per (row, block) when asymmetric, one scale when symmetric;
the value is q*scale + zero', zero' = zero - 2^(bits-1)*scale (symmetric: zero = 0).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mnngpu.errors import ConfigError, InputError, WeightFileError


@dataclass
class QuantInfo:
    weight_offset: int
    alpha_offset: int
    alpha_size: int
    bits: int
    block: int
    alpha_fp16: bool | None = None  # None: decide from alpha_size

    @classmethod
    def parse(cls, value, path) -> "QuantInfo":
        try:
            if isinstance(value, dict):
                fp16 = value.get("alpha_dtype", "fp32") == "fp16"
                return cls(int(value["weight_offset"]), int(value["alpha_offset"]), int(value["alpha_size"]),
                           int(value["quant_bit"]), int(value["quant_block"]), fp16)
            numbers = [int(v) for v in value]
            fp16 = bool(numbers[5]) if len(numbers) >= 6 else None
            return cls(*numbers[:5], fp16)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ConfigError("expected [weight_offset, alpha_offset, alpha_size, quant_bit, quant_block] "
                              f"or the dict form, got {value!r}", path=path, field="tie_embeddings") from exc


def _unpack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [rows, n_bytes] -> uint8 [rows, n_codes], most significant bits first."""
    if bits == 8:
        return codes
    if bits == 4:
        return np.stack([codes >> 4, codes & 15], axis=-1).reshape(codes.shape[0], -1)
    bitstream = np.unpackbits(codes, axis=1)
    usable = bitstream.shape[1] // bits * bits
    weights = (1 << np.arange(bits - 1, -1, -1)).astype(np.uint8)
    return (bitstream[:, :usable].reshape(codes.shape[0], -1, bits) * weights).sum(axis=-1).astype(np.uint8)


class DiskEmbedding:
    def __init__(self, hidden_size: int, embedding_path: Path, weight_path: Path, tie_embeddings=None,
                 config_path: str | os.PathLike | None = None):
        self.hidden = hidden_size
        self.quant = QuantInfo.parse(tie_embeddings, config_path) if tie_embeddings else None
        if self.quant is None:
            self.path = Path(embedding_path)
            self._bf16 = self._map(self.path, 0, None, np.uint16)
            if self._bf16.size % hidden_size:
                raise WeightFileError(f"size {self._bf16.size * 2} bytes is not a whole number of "
                                      f"bf16 rows of hidden_size {hidden_size}", path=self.path)
            self._bf16 = self._bf16.reshape(-1, hidden_size)
            self.vocab_size = self._bf16.shape[0]
        else:
            self.path = Path(weight_path if self.quant.weight_offset else embedding_path)
            self._init_quantized()

    @staticmethod
    def _map(path: Path, offset: int, length: int | None, dtype) -> np.ndarray:
        if not path.is_file():
            raise WeightFileError("embedding file is missing", path=path)
        size = path.stat().st_size
        length = size - offset if length is None else length
        if offset < 0 or length < 0 or offset + length > size:
            raise WeightFileError(f"needs bytes [{offset}, {offset + length}) but the file has {size}", path=path)
        if length == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(length,)).view(dtype)

    def _init_quantized(self) -> None:
        q = self.quant
        if q.bits not in (2, 3, 4, 8) or self.hidden * q.bits % 8:
            raise WeightFileError(f"unsupported embedding quant_bit {q.bits}", path=self.path, field="tie_embeddings")
        self.row_bytes = self.hidden * q.bits // 8
        self.block = q.block or self.hidden
        self.n_blocks = self.hidden // self.block
        self.vocab_size = (q.alpha_offset - q.weight_offset) // self.row_bytes
        self._codes = self._map(self.path, q.weight_offset, self.vocab_size * self.row_bytes, np.uint8)
        self._codes = self._codes.reshape(self.vocab_size, self.row_bytes)
        n_alpha = self.vocab_size * self.n_blocks
        fp16 = q.alpha_fp16 if q.alpha_fp16 is not None else q.alpha_size not in (4 * n_alpha, 8 * n_alpha)
        raw = self._map(self.path, q.alpha_offset, q.alpha_size, np.float16 if fp16 else np.float32)
        alpha = raw.astype(np.float32)
        offset = -(1 << (q.bits - 1))
        if alpha.size == 2 * n_alpha:
            alpha = alpha.reshape(self.vocab_size, self.n_blocks, 2)
            self._scale = alpha[..., 1]
            self._zero = alpha[..., 0] + offset * alpha[..., 1]
        elif alpha.size == n_alpha:
            self._scale = alpha.reshape(self.vocab_size, self.n_blocks)
            self._zero = offset * self._scale
        else:
            raise WeightFileError(f"alpha_size {q.alpha_size} fits neither {n_alpha} symmetric nor "
                                  f"{2 * n_alpha} asymmetric blocks", path=self.path, field="tie_embeddings")

    def rows(self, ids) -> np.ndarray:
        """float32 [len(ids), hidden] for the given token ids."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = int(ids[(ids < 0) | (ids >= self.vocab_size)][0])
            raise InputError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})", field="input_ids")
        if self.quant is None:
            return (self._bf16[ids].astype(np.uint32) << 16).view(np.float32)
        codes = _unpack(np.asarray(self._codes[ids]), self.quant.bits).reshape(len(ids), self.n_blocks, self.block)
        values = codes * self._scale[ids][..., None] + self._zero[ids][..., None]
        return values.reshape(len(ids), self.hidden).astype(np.float32)
