"""Packing and unpacking low-bit codes.

MNN stores b-bit codes as one continuous big-endian bit stream: code i occupies bits
[i*b, (i+1)*b), the first code in the most significant bits of the first byte. For
b = 4 that means element 2i is the high nibble of byte i.
"""

from __future__ import annotations

import numpy as np

_CHUNK = 1 << 20  # codes per step; a multiple of 8, so every chunk starts on a byte boundary


def packed_size(count: int, bits: int) -> int:
    return (count * bits + 7) // 8


def unpack_codes(stream: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first `count` codes of a `bits`-bit stream, one uint8 per code."""
    if bits == 8:
        return np.array(stream[:count], dtype=np.uint8)
    if bits == 4:
        return split_nibbles(stream[: packed_size(count, 4)])[:count]
    out = np.empty(count, dtype=np.uint8)
    place = (1 << np.arange(bits - 1, -1, -1)).astype(np.uint8)
    for start in range(0, count, _CHUNK):
        n = min(_CHUNK, count - start)
        first = start * bits // 8
        chunk_bits = np.unpackbits(stream[first: first + packed_size(n, bits)])[: n * bits]
        out[start: start + n] = (chunk_bits.reshape(n, bits) * place).sum(axis=1, dtype=np.uint8)
    return out


def split_nibbles(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., n] of two 4-bit codes each -> uint8 [..., 2n], high nibble first."""
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed >> 4
    out[..., 1::2] = packed & 0x0F
    return out


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """uint8 [..., n] of 4-bit codes -> uint8 [..., ceil(n/2)], element 2i in the high nibble."""
    if codes.shape[-1] % 2:
        pad = np.zeros(codes.shape[:-1] + (1,), dtype=np.uint8)
        codes = np.concatenate([codes, pad], axis=-1)
    return ((codes[..., 0::2] << 4) | codes[..., 1::2]).astype(np.uint8)
