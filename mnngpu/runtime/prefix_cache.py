"""PrefixCache: the KV cache of a prompt's start, kept on disk under prefix_cache_path and
reloaded when a later prompt starts with the same ids.

MNN's engine does the same for a prefix the caller names (`Llm::setPrefixCacheFile`): the first
call writes every layer's keys and values under prefix_cache_path, a later call with the file
present skips the prefix's prefill and reads them back. mnngpu names each file after what
decides its contents, so no caller has to:

    <model key>-<ids digest>.kv     model key: a digest of llm.mnn, llm.mnn.weight, the embedding
                                    rows and the settings that shape the KV values (backend,
                                    precision, attention_mode, attn_scale); ids digest: the prefix ids

A file is the magic, a JSON header (model key, ids, per-layer shapes, and each recurrent layer's
state shapes), each layer's keys then values as float32 (kv_heads, length, head_dim), each
recurrent layer's state after the ids (LinearAttention, backend.kv.StateCache: its parts as float32,
by op name then part name), and a BLAKE2b digest of all that. A file whose digest, model key, ids,
layers or state shapes do not match the model (backend.kv.CacheLayout) is refused with
CacheFileError and never used. Version 1 files hold no state: a model with recurrent layers refuses
them.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

import numpy as np

from mnngpu.backend import Backend
from mnngpu.backend.kv import CacheLayout, Layers, States
from mnngpu.backend.sequences import read_kv, read_states, write_kv, write_states
from mnngpu.errors import CacheFileError

MAGIC = b"MNNGPUKV"
VERSION = 2
READABLE = (1, VERSION)   # version 1: the same, without recurrent states
SUFFIX = ".kv"
DIGEST_BYTES = 32
_HEADER = struct.Struct("<8sII")   # magic, version, header JSON length

def _digest() -> hashlib.blake2b:
    return hashlib.blake2b(digest_size=DIGEST_BYTES)


def _hash_file(digest, path: Path) -> None:
    with open(path, "rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)


def model_key(config) -> str:
    """A digest of the files and settings that decide a prefix's keys and values."""
    digest = _digest()
    for path in dict.fromkeys((config.model_path, config.weight_path, config.embedding_rows_path)):
        digest.update(os.fspath(path.name).encode() + b"\0")
        _hash_file(digest, path)
    settings = {"backend_type": config.backend_type, "precision": config.precision,
                "attention_mode": config.attention_mode, "attn_scale": config.attn_scale}
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()


def _ids_digest(ids: list[int]) -> str:
    digest = _digest()
    digest.update(np.asarray(ids, dtype="<i4").tobytes())
    return digest.hexdigest()


def cache_directory(config) -> Path | None:
    """prefix_cache_path when a config file, set_config or the command line sets it; None otherwise."""
    if not config.is_set("prefix_cache_path"):
        return None
    return config.writable_folder("prefix_cache_path", "the prefix cache")


class PrefixCache:
    def __init__(self, directory: Path, make_key: Callable[[], str]):
        self.directory = directory
        self._make_key = make_key

    @cached_property
    def key(self) -> str:
        """The model key, computed on first use (it reads every weight byte once)."""
        return self._make_key()

    def path_for(self, ids: list[int]) -> Path:
        return self.directory / f"{self.key[:32]}-{_ids_digest(ids)[:32]}{SUFFIX}"

    # ---- finding ---------------------------------------------------------------------------

    def longest_prefix(self, ids: list[int]) -> list[int] | None:
        """The longest stored prefix of `ids` shorter than `ids` itself (one token must be left to
        prefill, for the logits); None when there is none."""
        best: list[int] | None = None
        for path in sorted(self.directory.glob(f"{self.key[:32]}-*{SUFFIX}")):
            stored = self._header(path, path.read_bytes())["ids"]
            if len(stored) < len(ids) and ids[: len(stored)] == stored and (best is None or len(stored) > len(best)):
                best = stored
        return best

    # ---- reading ---------------------------------------------------------------------------

    def restore(self, ids: list[int], layout: CacheLayout, backend: Backend, state_backend: Backend) -> None:
        """Fill `backend`'s KV caches with the stored keys and values of `ids`, and `state_backend`'s
        recurrent states (the backend that runs the LinearAttention ops) with theirs (load's checks apply)."""
        layers, states = self.load(ids, layout)
        write_kv(backend, layers)
        write_states(state_backend, states)

    def load(self, ids: list[int], layout: CacheLayout) -> tuple[Layers, States]:
        """The stored keys and values of `ids` and the recurrent states after them, for a model whose
        caches are laid out as `layout`. Raises CacheFileError for a damaged or foreign file."""
        path = self.path_for(ids)
        data = path.read_bytes()
        header = self._header(path, data)
        if header["ids"] != ids:
            raise CacheFileError("holds the keys and values of other prompt ids; delete it", path=path)
        shapes = {int(layer): tuple(shape) for layer, shape in header["layers"].items()}
        if sorted(shapes) != list(layout.kv_layers):
            raise CacheFileError(f"holds the keys and values of layers {sorted(shapes)}, the model's Attention "
                                 f"layers are {list(layout.kv_layers)}; delete it", path=path)
        _check_states(path, _state_shapes(header), layout.states)
        reader = _Reader(data, _HEADER.size + header["_json_bytes"])
        length = len(ids)
        layers: Layers = {layer: (reader.take((kv_heads, length, head_dim)), reader.take((kv_heads, length, head_dim)))
                          for layer, (kv_heads, head_dim) in sorted(shapes.items())}
        states: States = {name: {part: reader.take(shape) for part, shape in sorted(parts.items())}
                          for name, parts in sorted(layout.states.items())}
        if reader.offset != len(data) - DIGEST_BYTES:
            raise CacheFileError(f"expected {reader.offset + DIGEST_BYTES} bytes, got {len(data)}; delete it",
                                 path=path)
        return layers, states

    def _header(self, path: Path, data: bytes) -> dict:
        if len(data) < _HEADER.size + DIGEST_BYTES:
            raise CacheFileError(f"{len(data)} bytes is too short for a prefix-cache file; delete it", path=path)
        digest = _digest()
        digest.update(data[:-DIGEST_BYTES])
        if digest.digest() != data[-DIGEST_BYTES:]:
            raise CacheFileError("damaged: its checksum does not match its contents; delete it", path=path)
        magic, version, json_bytes = _HEADER.unpack_from(data)
        if magic != MAGIC or version not in READABLE:
            raise CacheFileError(f"expected an mnngpu prefix-cache file of version {' or '.join(map(str, READABLE))}; "
                                 "delete it", path=path)
        header = json.loads(data[_HEADER.size: _HEADER.size + json_bytes])
        if header.get("model") != self.key:
            raise CacheFileError("made by another model or other runtime settings (backend, precision, "
                                 "attention_mode); delete it", path=path)
        header["_json_bytes"] = json_bytes
        return header

    # ---- writing ---------------------------------------------------------------------------

    def store(self, ids: list[int], backend: Backend, state_backend: Backend) -> Path:
        """Save the keys and values `backend`'s KV caches hold for `ids` (its first len(ids) tokens),
        and the recurrent states `state_backend` holds after them."""
        return self.save(ids, read_kv(backend, len(ids)), read_states(state_backend))

    def save(self, ids: list[int], layers: Layers, states: States | None = None) -> Path:
        """Write the keys and values of `ids` and the states after them: to a temporary name, then
        renamed, so a reader never sees half a file."""
        states = states or {}
        header = {"model": self.key, "ids": [int(i) for i in ids],
                  "layers": {str(layer): [k.shape[0], k.shape[2]] for layer, (k, _) in sorted(layers.items())},
                  "states": {name: {part: list(value.shape) for part, value in sorted(parts.items())}
                             for name, parts in sorted(states.items())}}
        text = json.dumps(header).encode()
        digest = _digest()
        path = self.path_for(ids)
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        with open(partial, "wb") as file:
            for piece in self._pieces(text, layers, states):
                digest.update(piece)
                file.write(piece)
            file.write(digest.digest())
        os.replace(partial, path)
        return path

    @staticmethod
    def _pieces(text: bytes, layers: Layers, states: States):
        yield _HEADER.pack(MAGIC, VERSION, len(text))
        yield text
        for _, (keys, values) in sorted(layers.items()):
            yield np.ascontiguousarray(keys, dtype="<f4").tobytes()
            yield np.ascontiguousarray(values, dtype="<f4").tobytes()
        for _, parts in sorted(states.items()):
            for _, value in sorted(parts.items()):
                yield np.ascontiguousarray(value, dtype="<f4").tobytes()


class _Reader:
    """float32 arrays read one after another from a file's bytes."""

    def __init__(self, data: bytes, offset: int):
        self.data, self.offset = data, offset

    def take(self, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape))
        array = np.frombuffer(self.data, dtype="<f4", count=count, offset=self.offset).reshape(shape)
        self.offset += count * 4
        return array


def _state_shapes(header: dict) -> dict[str, dict[str, tuple[int, ...]]]:
    return {name: {part: tuple(shape) for part, shape in parts.items()}
            for name, parts in header.get("states", {}).items()}


def _check_states(path: Path, stored: dict, wanted: dict) -> None:
    """The file's recurrent states are the model's, each part of the model's shape."""
    if stored == wanted:
        return
    if wanted and not stored:
        raise CacheFileError(f"holds no recurrent state, but the model has {len(wanted)} recurrent layers "
                             "(LinearAttention) whose state must come with the keys and values; delete it", path=path)
    if sorted(stored) != sorted(wanted):
        raise CacheFileError(f"holds the states of layers {sorted(stored)}, the model's recurrent layers are "
                             f"{sorted(wanted)}; delete it", path=path)
    name = next(name for name in sorted(wanted) if stored[name] != wanted[name])
    raise CacheFileError(f"holds a state of {stored[name]} for {name}, the model's is {wanted[name]}; delete it",
                         path=path)
