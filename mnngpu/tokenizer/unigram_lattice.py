"""Unigram segmentation of a .mtok file's model, with MNN's own tie rule.

Both MNN's runtime and HuggingFace's `tokenizers` pick the segmentation whose piece scores sum
highest. Many vocabularies hold exact ties, where one multiset of pieces can be ordered two ways
("l" + "ll" and "ll" + "l" in "lll"); which one wins is then a matter of the search order. MNN
walks the text's UTF-8 bytes: for each end position it tries the start positions nearest first
and keeps a candidate only when it scores strictly higher, so on a tie the last piece is the
shortest. The library orders its lattice differently and gives the other answer, even in one
text and not another. A .mtok file is MNN's format, so its ids follow MNN's rule.

Other rules, MNN's too: the unk piece never matches as text; a byte no piece reaches becomes
its byte-fallback piece when the model has byte fallback; a position nothing reaches takes the
unk id over its last character; consecutive unk ids collapse into one.
"""

from __future__ import annotations

import json

import numba
import numpy as np

from mnngpu import jit
from mnngpu.tokenizer.added_tokens import TokenSplitter, split_out, token_splitters
from mnngpu.tokenizer.bpe_model import NO_ID, int_slot

DEFAULT_UNK_SCORE = -10.0   # MNN's unk score when the unk id lies outside the vocab


class UnigramLattice:
    """ids(word): the best-scoring pieces of one pre-tokenized word, ties broken as MNN does.
    The pieces' UTF-8 bytes form a trie whose edges (node * 256 + byte -> child) sit in an
    open-addressing table (bpe_model.int_slot)."""

    def __init__(self, pieces: list[tuple[str, float]], unk_id: int | None, byte_fallback: bool):
        encoded = [text.encode("utf-8") for text, _ in pieces]
        lengths = np.array([len(b) for b in encoded], np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        token_bytes = np.frombuffer(b"".join(encoded), np.uint8)
        self._keys = np.full(1 << max(4, (2 * len(token_bytes) + 2).bit_length()), -1, np.int64)
        self._children = np.zeros_like(self._keys)
        self._node_ids = np.full(len(token_bytes) + 1, NO_ID, np.int64)
        args = (token_bytes, offsets, self._keys, self._children, self._node_ids)
        jit.runnable(build_trie, args)(*args)
        self._unk = unk_id if unk_id is not None and unk_id < len(pieces) else NO_ID
        self._scores = np.array([score for _, score in pieces], np.float64)
        self._unk_score = self._scores[self._unk] if self._unk != NO_ID else DEFAULT_UNK_SCORE
        self._byte_ids = np.full(256, NO_ID, np.int64)
        if byte_fallback:
            vocab = {text: i for i, text in reversed(list(enumerate(encoded)))}
            self._byte_ids[:] = [vocab.get(f"<0x{b:02X}>".encode(), self._unk) for b in range(256)]

    def ids(self, word: str) -> list[int]:
        data = np.frombuffer(word.encode("utf-8"), np.uint8)
        work = (np.empty(len(data) + 1, np.float64), np.empty(len(data) + 1, np.int64),
                np.empty(len(data) + 1, np.int64), np.empty(len(data), np.int64))
        args = (data, self._keys, self._children, self._node_ids, self._scores, self._unk, self._unk_score,
                self._byte_ids, *work)
        count = jit.runnable(segment, args)(*args)
        return work[-1][:count].tolist()


@numba.njit(cache=True, nogil=True)
def build_trie(token_bytes, offsets, keys, children, node_ids) -> None:
    """Each token's bytes as a path from node 0; the path's end takes the token's id, the first
    token of a text keeping it."""
    nodes = 1
    for token in range(len(offsets) - 1):
        node = 0
        for at in range(offsets[token], offsets[token + 1]):
            key = node * 256 + token_bytes[at]
            slot = int_slot(keys, key)
            if keys[slot] != key:
                keys[slot], children[slot] = key, nodes
                nodes += 1
            node = children[slot]
        if node > 0 and node_ids[node] == NO_ID:
            node_ids[node] = token


@numba.njit(cache=True, nogil=True)
def segment(data, keys, children, node_ids, scores, unk, unk_score, byte_ids, best, start_of, id_of, out) -> int:
    """MNN's Viterbi over data's bytes, pieces ending at each position tried from the shortest,
    a candidate taken only when strictly better. Here the relaxation runs forward, from each start
    in turn, so a tie keeps the later start: the same choice. Writes the ids to out; returns
    their count (0 when no segmentation reaches the end)."""
    n = len(data)
    best[:] = -np.inf
    best[0] = 0.0
    for start in range(n + 1):
        if start > 0 and best[start] == -np.inf and unk != NO_ID:
            back = _last_char_length(data, start)
            if best[start - back] != -np.inf:
                best[start], start_of[start], id_of[start] = best[start - back] + unk_score, start - back, unk
        if start == n or best[start] == -np.inf:
            continue
        node, single = 0, False
        for end in range(start + 1, n + 1):
            key = node * 256 + data[end - 1]
            slot = int_slot(keys, key)
            if keys[slot] != key:
                break
            node = children[slot]
            token = node_ids[node]
            if token != NO_ID and token != unk:
                single = single or end == start + 1
                _relax(best, start_of, id_of, start, end, token, best[start] + scores[token])
        fallback = byte_ids[data[start]]
        if not single and fallback != NO_ID:
            score = unk_score if fallback == unk else scores[fallback]
            _relax(best, start_of, id_of, start, start + 1, fallback, best[start] + score)
    if best[n] == -np.inf:
        return 0
    count, end = 0, n
    while end > 0:
        if not (count and id_of[end] == unk and out[count - 1] == unk):
            out[count] = id_of[end]
            count += 1
        end = start_of[end]
    out[:count] = out[:count][::-1].copy()
    return count


@numba.njit(cache=True, inline="always")
def _relax(best, start_of, id_of, start, end, token, score) -> None:
    if score >= best[end]:
        best[end], start_of[end], id_of[end] = score, start, token


@numba.njit(cache=True)
def _last_char_length(data, end) -> int:
    """Bytes of the UTF-8 character that ends at `end`; 1 where they do not form one."""
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte & 0xC0 != 0x80:
            expected = 4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1
            return back if expected == back else 1
    return 1


class LatticeEncoder:
    """encode(text, prefix_ids): the library's added-token split, normalizer and pre-tokenizer,
    then each word through `lattice` instead of the library's model."""

    def __init__(self, raw_tokens: TokenSplitter, normalized_tokens: TokenSplitter, backend, lattice: UnigramLattice):
        self._raw_tokens = raw_tokens
        self._normalized_tokens = normalized_tokens
        self._normalize = backend.normalizer.normalize_str if backend.normalizer else (lambda text: text)
        self._pre_tokenizer = backend.pre_tokenizer
        self._lattice = lattice

    @classmethod
    def for_backend(cls, backend, lattice: UnigramLattice) -> LatticeEncoder | None:
        """None where splitting the text piece by piece would not be the library's split: added
        tokens with lstrip/rstrip/single_word, or a pre-tokenizer that treats the text's first
        piece apart (Metaspace's prepend_scheme "first")."""
        splitters = token_splitters(backend)
        if splitters is None or _prepends_to_first_piece_only(backend.pre_tokenizer):
            return None
        return cls(*splitters, backend, lattice)

    def encode(self, text: str, prefix_ids: list[int] = ()) -> list[int]:
        ids = list(prefix_ids)
        for piece in split_out(text, self._raw_tokens, self._normalized_tokens, self._normalize):
            ids.extend([piece] if isinstance(piece, int) else self._words(piece))
        return ids

    def _words(self, text: str) -> list[int]:
        words = [w for w, _ in self._pre_tokenizer.pre_tokenize_str(text)] if self._pre_tokenizer else [text]
        return [i for word in words for i in self._lattice.ids(word)]


def _prepends_to_first_piece_only(pre_tokenizer) -> bool:
    if pre_tokenizer is None:
        return False
    spec = json.loads(pre_tokenizer.__getstate__())
    return any(item.get("prepend_scheme") == "first" for item in spec.get("pretokenizers", [spec]))
