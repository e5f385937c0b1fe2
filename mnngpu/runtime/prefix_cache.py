"""PrefixCache: the KV cache of a prompt's start, kept on disk under prefix_cache_path and
reloaded when a later prompt starts with the same ids.

MNN's engine does the same for a prefix the caller names (`Llm::setPrefixCacheFile`): the first
call writes every layer's keys and values under prefix_cache_path, a later call with the file
present skips the prefix's prefill and reads them back. mnngpu names each file after what
decides its contents, so no caller has to:

    <model key>-<ids digest>.kv     model key: a digest of llm.mnn, llm.mnn.weight, the embedding
                                    rows and the settings that shape the KV values (backend,
                                    precision, attention_mode, attn_scale); ids digest: the prefix ids

A file is the magic, a JSON header (model key, ids, per-layer shapes), each layer's keys then
values as float32 (kv_heads, length, head_dim), and a BLAKE2b digest of all that. A file whose
digest, model key, ids or shapes do not match is refused with CacheFileError and never used.
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
from mnngpu.errors import CacheFileError
from mnngpu.runtime.kv import Layers, read_kv, write_kv

MAGIC = b"MNNGPUKV"
VERSION = 1
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

    def restore(self, ids: list[int], layer_count: int, backend: Backend) -> None:
        """Fill `backend`'s KV caches with the stored keys and values of `ids` (load's checks apply)."""
        write_kv(backend, self.load(ids, layer_count))

    def load(self, ids: list[int], layer_count: int) -> Layers:
        """The stored keys and values of `ids`, for a model of `layer_count` Attention layers.
        Raises CacheFileError for a damaged or foreign file."""
        path = self.path_for(ids)
        data = path.read_bytes()
        header = self._header(path, data)
        if header["ids"] != ids:
            raise CacheFileError("holds the keys and values of other prompt ids; delete it", path=path)
        shapes = {int(layer): tuple(shape) for layer, shape in header["layers"].items()}
        if sorted(shapes) != list(range(layer_count)):
            raise CacheFileError(f"holds layers {sorted(shapes)}, the model has {layer_count}; delete it", path=path)
        length = len(ids)
        offset = _HEADER.size + header["_json_bytes"]
        layers: Layers = {}
        for layer, (kv_heads, head_dim) in sorted(shapes.items()):
            count = kv_heads * length * head_dim
            pair = []
            for _ in range(2):
                pair.append(np.frombuffer(data, dtype="<f4", count=count, offset=offset)
                            .reshape(kv_heads, length, head_dim))
                offset += count * 4
            layers[layer] = (pair[0], pair[1])
        if offset != len(data) - DIGEST_BYTES:
            raise CacheFileError(f"expected {offset + DIGEST_BYTES} bytes, got {len(data)}; delete it", path=path)
        return layers

    def _header(self, path: Path, data: bytes) -> dict:
        if len(data) < _HEADER.size + DIGEST_BYTES:
            raise CacheFileError(f"{len(data)} bytes is too short for a prefix-cache file; delete it", path=path)
        digest = _digest()
        digest.update(data[:-DIGEST_BYTES])
        if digest.digest() != data[-DIGEST_BYTES:]:
            raise CacheFileError("damaged: its checksum does not match its contents; delete it", path=path)
        magic, version, json_bytes = _HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION:
            raise CacheFileError(f"expected an mnngpu prefix-cache file version {VERSION}; delete it", path=path)
        header = json.loads(data[_HEADER.size: _HEADER.size + json_bytes])
        if header.get("model") != self.key:
            raise CacheFileError("made by another model or other runtime settings (backend, precision, "
                                 "attention_mode); delete it", path=path)
        header["_json_bytes"] = json_bytes
        return header

    # ---- writing ---------------------------------------------------------------------------

    def store(self, ids: list[int], backend: Backend) -> Path:
        """Save the keys and values `backend`'s KV caches hold for `ids` (its first len(ids) tokens)."""
        return self.save(ids, read_kv(backend, len(ids)))

    def save(self, ids: list[int], layers: Layers) -> Path:
        """Write the keys and values of `ids`: to a temporary name, then renamed, so a reader never
        sees half a file."""
        header = {"model": self.key, "ids": [int(i) for i in ids],
                  "layers": {str(layer): [k.shape[0], k.shape[2]] for layer, (k, _) in sorted(layers.items())}}
        text = json.dumps(header).encode()
        digest = _digest()
        path = self.path_for(ids)
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        with open(partial, "wb") as file:
            for piece in self._pieces(text, layers):
                digest.update(piece)
                file.write(piece)
            file.write(digest.digest())
        os.replace(partial, path)
        return path

    @staticmethod
    def _pieces(text: bytes, layers: Layers):
        yield _HEADER.pack(MAGIC, VERSION, len(text))
        yield text
        for _, (keys, values) in sorted(layers.items()):
            yield np.ascontiguousarray(keys, dtype="<f4").tobytes()
            yield np.ascontiguousarray(values, dtype="<f4").tobytes()
