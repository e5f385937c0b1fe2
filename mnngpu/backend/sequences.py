"""A sequence's caches moved in and out of a backend: `enter` makes one sequence the backend's
current one, `segments` walks a batched forward's rows sequence by sequence, and the prefix cache
reads and writes a sequence's keys, values and recurrent states (Capabilities.kv_transfer)."""

from __future__ import annotations

from collections.abc import Iterator

from mnngpu.backend.interface import Backend
from mnngpu.backend.kv import HostStateCache, Layers, Segment, Sequence, States


def enter(backend: Backend, sequence: Sequence) -> None:
    """Make `backend` run `sequence` from now on: its KVMeta and its caches become the backend's."""
    backend.kv_meta = sequence.meta
    backend.kv_caches, backend.state_caches = sequence.caches_on(backend)


def segments(backend: Backend, rows: int) -> Iterator[Segment | None]:
    """The parts of a forward's `rows` rows that belong to one sequence each, for the executions that
    keep a sequence's caches (Attention, recurrent layers): one None (all rows, the current
    sequence) outside a batched forward (`backend.batch` None); in one, each Segment with its
    sequence entered while the caller handles it, and the current sequence entered again after."""
    if backend.batch is None:
        yield None
        return
    current = backend.kv_meta, backend.kv_caches, backend.state_caches
    try:
        for segment in backend.batch:
            enter(backend, segment.sequence)
            yield segment
    finally:
        backend.kv_meta, backend.kv_caches, backend.state_caches = current


def cache_nbytes(backend: Backend) -> int:
    """Bytes a backend holds for the sequence: every layer's keys and values and every recurrent state."""
    return (sum(cache.nbytes for cache in backend.kv_caches.values())
            + sum(state.nbytes for state in backend.state_caches.values()))


def read_kv(backend: Backend, length: int) -> Layers:
    """Each layer's first `length` keys and values (the prefix cache's; Capabilities.kv_transfer)."""
    backend.finish()
    return {layer: cache.read(length) for layer, cache in sorted(backend.kv_caches.items())}


def write_kv(backend: Backend, layers: Layers) -> None:
    """Make each layer's cache hold exactly these keys and values (as read_kv returns them)."""
    backend.finish()
    for layer, (keys, values) in layers.items():
        backend.kv_cache(layer, keys.shape[0], keys.shape[2]).write(keys, values)


def read_states(backend: Backend) -> States:
    """Every recurrent layer's state the backend holds, by op name (the prefix cache's)."""
    backend.finish()
    return {name: state.read() for name, state in sorted(backend.state_caches.items())}


def write_states(backend: Backend, states: States) -> None:
    """Make each recurrent layer's state hold exactly these parts (as read_states returns them), a
    HostStateCache where the layer has not run yet."""
    backend.finish()
    for name, parts in states.items():
        if name not in backend.state_caches:
            backend.state_caches[name] = HostStateCache({part: value.shape for part, value in parts.items()})
        backend.state_caches[name].write(parts)
