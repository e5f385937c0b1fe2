"""HuggingFace's BPE model in numba, for the words the word cache has not seen.

It is the algorithm of `tokenizers`' `BPE::merge_word` and `Word::merge_all`: each character
becomes its vocab id (or its UTF-8 bytes' <0xHH> ids under byte fallback, or the unk id, runs of
unknowns fused when fuse_unk); then, while any adjacent pair has a merge, the pair with the best
(lowest) rank is merged, the leftmost first on a tie, through a heap keyed (rank, position) whose
stale entries are skipped. The model is read from the library's own serialization of it;
`BpeWords.for_model` returns None for options not done here (continuing-subword prefix,
end-of-word suffix, dropout, ignore_merges).
"""

from __future__ import annotations

import json

import numba
import numpy as np

from mnngpu.tokenizer.byte_level import BYTE_TO_CHAR
from mnngpu.tokenizer.code_point_table import CODE_POINTS

NO_ID = -1
HASH_MULTIPLIER = 0x2545F4914F6CDD1D       # odd, below 2**63: int64 products wrap, never floats


@numba.njit(cache=True)
def int_slot(keys, key) -> int:
    """The slot of `key` in an open-addressing table of int64 keys (-1 free): its own, or the free
    one where it would go."""
    mask = len(keys) - 1
    slot = (key * HASH_MULTIPLIER) & mask
    while keys[slot] != -1 and keys[slot] != key:
        slot = (slot + 1) & mask
    return slot


@numba.njit(cache=True)
def _build_pair_table(lefts, rights, news, vocab_size, keys, ranks, new_ids) -> None:
    for rank in range(len(lefts)):
        key = lefts[rank] * vocab_size + rights[rank]
        slot = int_slot(keys, key)
        keys[slot] = key
        ranks[slot] = rank
        new_ids[slot] = news[rank]


@numba.njit(cache=True)
def _utf8(c, out, at) -> int:
    """Write code point c's UTF-8 bytes at out[at:]; returns the count."""
    if c < 0x80:
        out[at] = c
        return 1
    if c < 0x800:
        out[at], out[at + 1] = 0xC0 | (c >> 6), 0x80 | (c & 0x3F)
        return 2
    if c < 0x10000:
        out[at], out[at + 1], out[at + 2] = 0xE0 | (c >> 12), 0x80 | ((c >> 6) & 0x3F), 0x80 | (c & 0x3F)
        return 3
    out[at], out[at + 1] = 0xF0 | (c >> 18), 0x80 | ((c >> 12) & 0x3F)
    out[at + 2], out[at + 3] = 0x80 | ((c >> 6) & 0x3F), 0x80 | (c & 0x3F)
    return 4


@numba.njit(cache=True)
def _symbols(cps, start, end, byte_level, byte_fallback, char_ids, byte_ids, unk_id, fuse_unk, sym, scratch) -> int:
    """The word's first symbols (merge_word before merge_all) into sym; returns their count.
    byte_ids[b] is the id of byte b's byte-level character (byte_level) or of its <0xHH> token."""
    n = 0
    pending_unk = False
    for i in range(start, end):
        chars = 1
        if byte_level:                     # each UTF-8 byte is one byte-level character
            chars = _utf8(cps[i], scratch, 0)
        for b in range(chars):
            c = byte_ids[scratch[b]] if byte_level else char_ids[cps[i]]
            if c != NO_ID:
                if pending_unk:
                    sym[n] = unk_id
                    n += 1
                    pending_unk = False
                sym[n] = c
                n += 1
                continue
            if byte_fallback:                   # the bytes' <0xHH> ids, when every byte has one
                count = _utf8(cps[i], scratch, 0)
                found = True
                for k in range(count):
                    found = found and byte_ids[scratch[k]] != NO_ID
                if found:
                    for k in range(count):
                        sym[n] = byte_ids[scratch[k]]
                        n += 1
                    continue
            if unk_id != NO_ID:
                if pending_unk and not fuse_unk:
                    sym[n] = unk_id
                    n += 1
                pending_unk = True
    if pending_unk:
        sym[n] = unk_id
        n += 1
    return n


@numba.njit(cache=True)
def _merge_all(sym, n, keys, ranks, new_ids, vocab_size, heap, nxt, prv, alive) -> int:
    """Word::merge_all over sym[:n]; the merged symbols are written back to sym; returns their count."""
    size = 0
    for p in range(n):
        nxt[p], prv[p], alive[p] = p + 1, p - 1, True
    for p in range(n - 1):
        slot = int_slot(keys, sym[p] * vocab_size + sym[p + 1])
        if keys[slot] != -1:
            size = _heap_push(heap, size, (ranks[slot] << 32) | p)
    while size > 0:
        top = heap[0]
        size = _heap_pop(heap, size)
        rank, pos = top >> 32, top & 0xFFFFFFFF
        right = nxt[pos]
        if not alive[pos] or right >= n:
            continue
        slot = int_slot(keys, sym[pos] * vocab_size + sym[right])
        if keys[slot] == -1 or ranks[slot] != rank:
            continue                                   # an entry for a pair that has changed since
        sym[pos] = new_ids[slot]
        alive[right] = False
        nxt[pos] = nxt[right]
        if nxt[pos] < n:
            prv[nxt[pos]] = pos
        if prv[pos] >= 0:
            slot = int_slot(keys, sym[prv[pos]] * vocab_size + sym[pos])
            if keys[slot] != -1:
                size = _heap_push(heap, size, (ranks[slot] << 32) | prv[pos])
        if nxt[pos] < n:
            slot = int_slot(keys, sym[pos] * vocab_size + sym[nxt[pos]])
            if keys[slot] != -1:
                size = _heap_push(heap, size, (ranks[slot] << 32) | pos)
    kept = 0
    for p in range(n):
        if alive[p]:
            sym[kept] = sym[p]
            kept += 1
    return kept


@numba.njit(cache=True)
def _heap_push(heap, size, key) -> int:
    i = size
    heap[i] = key
    while i > 0 and heap[(i - 1) >> 1] > heap[i]:
        parent = (i - 1) >> 1
        heap[i], heap[parent] = heap[parent], heap[i]
        i = parent
    return size + 1


@numba.njit(cache=True)
def _heap_pop(heap, size) -> int:
    size -= 1
    heap[0] = heap[size]
    i = 0
    while True:
        smallest, left, right = i, 2 * i + 1, 2 * i + 2
        if left < size and heap[left] < heap[smallest]:
            smallest = left
        if right < size and heap[right] < heap[smallest]:
            smallest = right
        if smallest == i:
            return size
        heap[i], heap[smallest] = heap[smallest], heap[i]
        i = smallest


@numba.njit(cache=True)
def _encode_spans(cp_pool, spans, byte_level, byte_fallback, char_ids, byte_ids, unk_id, fuse_unk, keys, ranks,
                  new_ids, vocab_size):
    """The ids of each word cp_pool[start:start + length] for (start, length) in spans."""
    longest = 1
    total = 0
    for w in range(len(spans)):
        longest = max(longest, spans[w, 1])
        total += spans[w, 1]
    most = 4 * longest                    # symbols per word: at most 4 bytes per character
    sym, nxt, prv = np.empty(most, np.int64), np.empty(most, np.int64), np.empty(most, np.int64)
    alive, heap, scratch = np.empty(most, np.bool_), np.empty(3 * most, np.int64), np.empty(4, np.int64)
    lengths, flat = np.empty(len(spans), np.int64), np.empty(4 * total, np.int64)
    at = 0
    for w in range(len(spans)):
        start = spans[w, 0]
        n = _symbols(cp_pool, start, start + spans[w, 1], byte_level, byte_fallback, char_ids, byte_ids,
                     unk_id, fuse_unk, sym, scratch)
        n = _merge_all(sym, n, keys, ranks, new_ids, vocab_size, heap, nxt, prv, alive)
        flat[at:at + n] = sym[:n]
        lengths[w] = n
        at += n
    return lengths, flat[:at]


class BpeWords:
    """The model's ids for words given as (start, length) spans of a code point pool."""

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], byte_level: bool,
                 byte_fallback: bool, unk_id: int, fuse_unk: bool):
        self._vocab_size = max(vocab.values(), default=0) + 1
        self._byte_level = byte_level
        self._byte_fallback = byte_fallback and not byte_level
        self._unk_id, self._fuse_unk = unk_id, fuse_unk
        self._char_ids = np.full(CODE_POINTS, NO_ID, np.int32)
        for token, token_id in vocab.items():
            if len(token) == 1:
                self._char_ids[ord(token)] = token_id
        if byte_level:
            self._byte_ids = self._char_ids[[ord(c) for c in BYTE_TO_CHAR]].astype(np.int64)
        elif byte_fallback:
            self._byte_ids = np.array([vocab.get(f"<0x{b:02X}>", NO_ID) for b in range(256)], np.int64)
        else:
            self._byte_ids = np.full(256, NO_ID, np.int64)
        self._byte_ids_complete = bool((self._byte_ids != NO_ID).all())
        # each merge's (left, right, merged) ids; their hash table is built at the first call, so that
        # a run whose kernels are not compiled yet (mnngpu/jit.py) compiles none of its own for it
        self._merge_ids = (np.array([vocab[a] for a, _ in merges], np.int64),
                           np.array([vocab[b] for _, b in merges], np.int64),
                           np.array([vocab[a + b] for a, b in merges], np.int64))
        self._pair_table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def _pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys, ranks, new ids) of the merges' open-addressing table, keyed left * vocab_size + right."""
        if self._pair_table is None:
            slots = 1 << max(4, (2 * len(self._merge_ids[0])).bit_length())
            keys, ranks, new_ids = np.full(slots, -1, np.int64), np.zeros(slots, np.int64), np.zeros(slots, np.int64)
            _build_pair_table(*self._merge_ids, self._vocab_size, keys, ranks, new_ids)
            self._pair_table = keys, ranks, new_ids
        return self._pair_table

    @classmethod
    def for_model(cls, model_state: bytes, byte_level: bool) -> BpeWords | None:
        """From `model.__getstate__()` of a library BPE; None when it uses an option not done here."""
        spec = json.loads(model_state)
        if spec.get("type") != "BPE" or spec.get("dropout") not in (None, 0.0) or spec.get("ignore_merges"):
            return None
        if spec.get("continuing_subword_prefix") or spec.get("end_of_word_suffix"):
            return None
        vocab = spec["vocab"]
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["merges"]]
        if any(len(m) != 2 or m[0] not in vocab or m[1] not in vocab or m[0] + m[1] not in vocab for m in merges):
            return None
        unk = spec.get("unk_token")
        if unk is not None and unk not in vocab:
            return None              # the library raises for such a word; let it
        words = cls(vocab, merges, byte_level, bool(spec.get("byte_fallback")),
                    NO_ID if unk is None else vocab[unk], bool(spec.get("fuse_unk")))
        if byte_level and not words._byte_ids_complete:
            return None              # a byte-level character outside the vocab: the library's path
        return words

    def __call__(self, cp_pool: np.ndarray, spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _encode_spans(cp_pool, spans, self._byte_level, self._byte_fallback, self._char_ids, self._byte_ids,
                             self._unk_id, self._fuse_unk, *self._pairs(), self._vocab_size)
