"""A cache from a word (its code points) to the model's ids for it, looked up in numba.

Natural text repeats its words, and the model's ids for a word never depend on its neighbours, so
each distinct word is given to the model once. Words live in an open-addressing hash table: a slot
holds an entry index and the word's 64-bit hash; an entry is (code point offset, length, id
offset, id count) into two pools. A word seen for the first time gets an entry with id count -1
(reserved); the caller asks the model for the reserved words and stores their ids.
"""

from __future__ import annotations

import numba
import numpy as np

START_SLOTS = 1 << 12
MAX_CACHED_WORDS = 1 << 20       # past this, the cache starts afresh on the next text
CP_START, CP_LEN, ID_START, ID_LEN = range(4)


# One loop per function: a numba call to a function that takes arrays costs more than a lookup.

@numba.njit(cache=True)
def _find_or_reserve(cps, starts, ends, first, count, found, slots, slot_hashes, entries, n_entries,
                     cp_pool, cp_used):
    """found[w] = the entry of word w, for w from `first`; unseen words get reserved entries.
    Stops before a word that would overfill the entries (or half the slots) or the code point
    pool, and returns (next word, entries used, pool used)."""
    limit = min(len(entries), len(slots) // 2)
    mask = len(slots) - 1
    for w in range(first, count):
        start, end = starts[w], ends[w]
        length = end - start
        h = np.uint64(0xCBF29CE484222325)                       # FNV-1a over the code points
        for i in range(start, end):
            h = (h ^ np.uint64(cps[i])) * np.uint64(0x100000001B3)
        slot = np.int64(h & np.uint64(mask))
        entry = slots[slot]
        while entry >= 0:
            if slot_hashes[slot] == h and entries[entry, CP_LEN] == length:
                at = entries[entry, CP_START]
                same = True
                for k in range(length):
                    if cps[start + k] != cp_pool[at + k]:
                        same = False
                        break
                if same:
                    break
            slot = (slot + 1) & mask
            entry = slots[slot]
        if entry < 0:
            if n_entries >= limit or cp_used + length > len(cp_pool):
                return w, n_entries, cp_used
            cp_pool[cp_used:cp_used + length] = cps[start:end]
            entries[n_entries, CP_START] = cp_used
            entries[n_entries, CP_LEN] = length
            entries[n_entries, ID_START] = 0
            entries[n_entries, ID_LEN] = -1
            slots[slot] = n_entries
            slot_hashes[slot] = h
            entry = n_entries
            n_entries += 1
            cp_used += length
        found[w] = entry
    return count, n_entries, cp_used


@numba.njit(cache=True)
def _rehash(slots, slot_hashes, entries, n_entries, cp_pool):
    """Put every entry into the (empty, bigger) slot table."""
    mask = len(slots) - 1
    for entry in range(n_entries):
        h = np.uint64(0xCBF29CE484222325)
        for i in range(entries[entry, CP_START], entries[entry, CP_START] + entries[entry, CP_LEN]):
            h = (h ^ np.uint64(cp_pool[i])) * np.uint64(0x100000001B3)
        slot = np.int64(h & np.uint64(mask))
        while slots[slot] >= 0:
            slot = (slot + 1) & mask
        slots[slot] = entry
        slot_hashes[slot] = h


@numba.njit(cache=True)
def _gather(found, count, entries, id_pool):
    total = 0
    for w in range(count):
        total += entries[found[w], ID_LEN]
    out = np.empty(total, np.int64)
    at = 0
    for w in range(count):
        start, length = entries[found[w], ID_START], entries[found[w], ID_LEN]
        for k in range(length):
            out[at + k] = id_pool[start + k]
        at += length
    return out


def _grown(array: np.ndarray, needed: int) -> np.ndarray:
    if needed <= len(array):
        return array
    bigger = np.zeros((max(needed, 2 * len(array)), *array.shape[1:]), array.dtype)
    bigger[:len(array)] = array
    return bigger


class WordCache:
    """`ids(cps, starts, ends, count, model)`: the ids of the words cps[starts[w]:ends[w]], with
    `model(cp_pool, spans) -> (lengths, flat ids)` asked once for each word never seen before,
    the words given as (start, length) rows of the code point pool."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._slots = np.full(START_SLOTS, -1, np.int64)
        self._slot_hashes = np.zeros(START_SLOTS, np.uint64)
        self._entries = np.zeros((START_SLOTS // 2, 4), np.int64)
        self._cp_pool = np.zeros(START_SLOTS * 4, np.uint32)
        self._id_pool = np.zeros(START_SLOTS * 4, np.int64)
        self._n_entries = self._cp_used = self._id_used = 0

    def __len__(self) -> int:
        return self._n_entries

    def ids(self, cps: np.ndarray, starts: np.ndarray, ends: np.ndarray, count: int, model) -> np.ndarray:
        if self._n_entries > MAX_CACHED_WORDS:
            self.clear()
        before = self._n_entries
        try:
            found = self._find_all(cps, starts, ends, count)
            if self._n_entries > before:
                self._store_new_words(before, model)
        except BaseException:
            self.clear()          # no reserved entry may stay without its ids
            raise
        return _gather(found, count, self._entries, self._id_pool)

    def _find_all(self, cps, starts, ends, count) -> np.ndarray:
        found = np.empty(count, np.int64)
        if len(self._slots) < 2 * (self._n_entries + count // 8):     # room for the usual share of new words
            self._rehash(1 << (2 * (self._n_entries + count // 8)).bit_length())
        word = 0
        while True:
            word, self._n_entries, self._cp_used = _find_or_reserve(
                cps, starts, ends, word, count, found, self._slots, self._slot_hashes, self._entries,
                self._n_entries, self._cp_pool, self._cp_used)
            if word == count:
                return found
            self._grow(int(ends[word] - starts[word]))

    def _grow(self, word_length: int) -> None:
        if self._n_entries >= len(self._slots) // 2:
            self._rehash(2 * len(self._slots))
        self._entries = _grown(self._entries, self._n_entries + 1)
        self._cp_pool = _grown(self._cp_pool, self._cp_used + word_length)

    def _rehash(self, slot_count: int) -> None:
        self._slots = np.full(slot_count, -1, np.int64)
        self._slot_hashes = np.zeros(slot_count, np.uint64)
        _rehash(self._slots, self._slot_hashes, self._entries, self._n_entries, self._cp_pool)

    def _store_new_words(self, first: int, model) -> None:
        new = self._entries[first:self._n_entries]
        # a copy: the slice of one row is C-contiguous and of several is not, and numba compiles
        # the model's kernel once per layout (a second compile, seconds, in the run after the first)
        lengths, flat = model(self._cp_pool, np.ascontiguousarray(new[:, CP_START:CP_LEN + 1]))
        self._id_pool = _grown(self._id_pool, self._id_used + len(flat))
        self._id_pool[self._id_used:self._id_used + len(flat)] = flat
        new[:, ID_START] = self._id_used + np.cumsum(lengths) - lengths
        new[:, ID_LEN] = lengths
        self._id_used += len(flat)
