"""BlockCache: the keys and values of prompts' starts, in blocks of BLOCK_TOKENS tokens, shared by
every request of a server whatever its slot.

A block is named by a chained hash: the digest of its parent block's name and its own token ids,
so one name stands for the whole prefix up to the block's end and two prompts that share a start
share its blocks. A block holds every Attention layer's keys and values for its tokens (float32
(kv_heads, BLOCK_TOKENS, head_dim), as backend.sequences.read_kv gives them) and, where a model has
recurrent layers (LinearAttention), may hold their state after its last token: such a model can
only resume from a block that carries one (a checkpoint).

The cache lives in host memory and counts every byte it holds against `budget`; past it, the least
recently used blocks go first. A hit refreshes a prompt's blocks deepest first, so a chain is
evicted from its tail and a start that many prompts share outlives the ends that differ.

`claim` lets the request that is about to compute a chain's missing blocks say so; a request that
needs the same blocks waits for it (`wait_for`) instead of computing them a second time.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from mnngpu.backend.kv import Layers, States

BLOCK_TOKENS = 32   # tokens a block holds; a hit is a whole number of blocks
MIB = 1 << 20


def chain_hashes(ids: list[int], blocks: int) -> list[bytes]:
    """The names of the first `blocks` whole blocks of `ids`, each hashing its parent's name."""
    names, parent = [], b""
    for index in range(blocks):
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(np.asarray(ids[index * BLOCK_TOKENS:(index + 1) * BLOCK_TOKENS], dtype="<i4").tobytes())
        parent = digest.digest()
        names.append(parent)
    return names


def reusable_blocks(count: int) -> int:
    """Whole blocks of a prompt of `count` ids that may come from the cache: one id is always left
    to prefill, for the logits of the first reply token."""
    return max(count - 1, 0) // BLOCK_TOKENS


@dataclass
class Block:
    layers: Layers                 # layer -> (keys, values), float32 (kv_heads, BLOCK_TOKENS, head_dim)
    states: States | None = None   # the recurrent layers' state after the block's last token

    @property
    def nbytes(self) -> int:
        arrays = [a for pair in self.layers.values() for a in pair]
        arrays += [a for parts in (self.states or {}).values() for a in parts.values()]
        return sum(a.nbytes for a in arrays)


@dataclass
class CacheCounts:
    """In tokens, as vLLM counts them: prompt tokens looked up, and those found."""

    queries: int = 0
    hits: int = 0
    evicted_blocks: int = 0


@dataclass
class Claim:
    names: set[bytes]
    done: threading.Event = field(default_factory=threading.Event)


class BlockCache:
    def __init__(self, budget: int, needs_states: bool):
        self.budget = budget               # bytes
        self.needs_states = needs_states   # a hit must end at a block with a state checkpoint
        self.blocks: OrderedDict[bytes, Block] = OrderedDict()   # least recently used first
        self.nbytes = 0
        self.counts = CacheCounts()
        self._claims: list[Claim] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.blocks)

    # ---- finding -------------------------------------------------------------------------------
    def lookup(self, names: list[bytes]) -> list[Block]:
        """The cached blocks the chain starts with (for a recurrent model, up to its last state
        checkpoint), refreshed; the query is counted by the caller (`count`)."""
        with self._lock:
            found = self._longest(names)
            for name in reversed(names[:len(found)]):
                self.blocks.move_to_end(name)
            return found

    def _longest(self, names: list[bytes]) -> list[Block]:
        found: list[Block] = []
        for name in names:
            block = self.blocks.get(name)
            if block is None:
                break
            found.append(block)
        if self.needs_states:
            while found and found[-1].states is None:
                found.pop()
        return found

    def count(self, queried: int, hit: int) -> None:
        with self._lock:
            self.counts.queries += queried
            self.counts.hits += hit

    # ---- computing missing blocks once -----------------------------------------------------------
    def claim(self, names: list[bytes]) -> Claim | None:
        """Claim the blocks `names` this request will compute; None (nothing claimed) where another
        request claimed one of them first: wait_for() it, then look up again."""
        with self._lock:
            if any(claim.names.intersection(names) for claim in self._claims):
                return None
            claim = Claim(set(names))
            self._claims.append(claim)
            return claim

    def wait_for(self, names: list[bytes], timeout: float | None = None) -> None:
        """Block until no request holds a claim on any of `names`."""
        while True:
            with self._lock:
                claim = next((c for c in self._claims if c.names.intersection(names)), None)
            if claim is None or not claim.done.wait(timeout):
                return

    def release(self, claim: Claim) -> None:
        with self._lock:
            self._claims.remove(claim)
        claim.done.set()

    # ---- storing --------------------------------------------------------------------------------
    def store(self, names: list[bytes], blocks: list[Block]) -> None:
        """Keep `blocks` under `names` (a chain's consecutive blocks), evicting the least recently
        used blocks past the budget. A block already held keeps its contents; a state checkpoint
        is added to it where the new one has one."""
        with self._lock:
            for name, block in reversed(list(zip(names, blocks))):
                held = self.blocks.get(name)
                if held is None:
                    self.blocks[name] = block
                    self.nbytes += block.nbytes
                elif held.states is None and block.states is not None:
                    held.states = block.states
                    self.nbytes += sum(a.nbytes for parts in block.states.values() for a in parts.values())
                self.blocks.move_to_end(name)
            self._evict()

    def _evict(self) -> None:
        while self.blocks and self.nbytes > self.budget:
            _, block = self.blocks.popitem(last=False)
            self.nbytes -= block.nbytes
            self.counts.evicted_blocks += 1


def split_blocks(layers: Layers, first: int, count: int) -> list[dict]:
    """Blocks first .. first + count - 1 of layers read from a sequence's start, each its own copy."""
    out = []
    for index in range(first, first + count):
        start, end = index * BLOCK_TOKENS, (index + 1) * BLOCK_TOKENS
        out.append({layer: (np.ascontiguousarray(keys[:, start:end]), np.ascontiguousarray(values[:, start:end]))
                    for layer, (keys, values) in layers.items()})
    return out


def joined_layers(blocks: list[Block]) -> Layers:
    """The keys and values of consecutive blocks as one sequence start (write_kv's input)."""
    return {layer: (np.concatenate([b.layers[layer][0] for b in blocks], axis=1),
                    np.concatenate([b.layers[layer][1] for b in blocks], axis=1))
            for layer in blocks[0].layers}
