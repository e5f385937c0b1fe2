"""Per-code-point facts, learnt on demand from the library that defines them.

The fast encoder's scanners and normalizer look up each character in a table of all 0x110000 code
points. The values are not taken from Python's `unicodedata`, whose Unicode version differs from
the one compiled into HuggingFace's `tokenizers` (its Oniguruma, its Rust std, its category
crate): each code point is asked of the library the first time a text contains it, so the table
always agrees with what the library itself would do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numba
import numpy as np

CODE_POINTS = 0x110000
UNKNOWN = 255
PENDING = 254


@numba.njit(cache=True)
def _claim_unknown(cps: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The distinct code points of `cps` not yet in `values`, each marked PENDING."""
    missing = np.empty(len(cps), np.int64)
    count = 0
    for c in cps:
        if values[c] == UNKNOWN:
            values[c] = PENDING
            missing[count] = c
            count += 1
    return missing[:count]


def _ask_missing(values: np.ndarray, cps: np.ndarray, probe: Callable[[list[str]], list]) -> tuple:
    """The code points of cps whose `values` entry is UNKNOWN, and probe's answers for them;
    they stay UNKNOWN when probe fails."""
    missing = _claim_unknown(cps, values)
    if not len(missing):
        return missing, []
    try:
        return missing, probe([chr(c) for c in missing])
    except BaseException:
        values[missing] = UNKNOWN
        raise


class CodePointTable:
    """values[c] is one byte of facts about code point c; `probe(chars)` gives the bytes of the
    characters not asked before (never UNKNOWN or PENDING)."""

    def __init__(self, probe: Callable[[list[str]], list[int]]):
        self.values = np.full(CODE_POINTS, UNKNOWN, np.uint8)
        self._probe = probe
        self._lock = threading.Lock()

    def fill_for(self, cps: np.ndarray) -> None:
        """Make sure every code point of `cps` has its value."""
        with self._lock:
            missing, answers = _ask_missing(self.values, cps, self._probe)
            if len(missing):
                self.values[missing] = answers


class CodePointMap:
    """What a per-character normalizer turns each code point into: `pool[offset[c]:offset[c] +
    length[c]]`, plus a `flags` byte per code point. `probe(chars)` gives (text, flags) for the
    characters not asked before."""

    def __init__(self, probe: Callable[[list[str]], list[tuple[str, int]]]):
        self.offset = np.zeros(CODE_POINTS, np.int32)
        self.length = np.zeros(CODE_POINTS, np.int16)
        self.flags = np.full(CODE_POINTS, UNKNOWN, np.uint8)
        self.pool = np.zeros(1024, np.uint32)      # grows by doubling; pool_used entries are set
        self.pool_used = 0
        self._probe = probe
        self._lock = threading.Lock()

    def fill_for(self, cps: np.ndarray) -> None:
        with self._lock:
            missing, answers = _ask_missing(self.flags, cps, self._probe)
            if not len(missing):
                return
            texts = [text for text, _ in answers]
            lengths = np.array([len(text) for text in texts], np.int64)
            mapped = np.frombuffer("".join(texts).encode("utf-32-le"), np.uint32)
            if self.pool_used + len(mapped) > len(self.pool):
                bigger = np.zeros(max(2 * len(self.pool), self.pool_used + len(mapped)), np.uint32)
                bigger[:self.pool_used] = self.pool[:self.pool_used]
                self.pool = bigger
            self.pool[self.pool_used:self.pool_used + len(mapped)] = mapped
            self.offset[missing] = self.pool_used + np.cumsum(lengths) - lengths
            self.length[missing] = lengths
            self.pool_used += len(mapped)
            self.flags[missing] = [flags for _, flags in answers]
