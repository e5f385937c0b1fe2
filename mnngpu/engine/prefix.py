"""The prefix cache (prefix_cache_path): a prompt's start prefilled once, its KV rows and
recurrent states stored on disk and read back instead of prefilled."""

from __future__ import annotations

from mnngpu.backend.kv import Layers, States
from mnngpu.backend.sequences import read_kv, read_states, write_kv, write_states
from mnngpu.errors import ConfigError, InputError


class LlmPrefix:
    """cache_prefix and generate()'s reuse of a stored prefix. Uses the `prefix_cache` and
    `cache_layout` that load() opens, runtime (kv_meta, backends, placements) and context."""

    # ---- the prefix cache (prefix_cache_path) -------------------------------------------------
    def cache_prefix(self, ids) -> int:
        """Put the keys and values of `ids`, a prompt's reusable start (a system prompt, a
        document), into the empty KV cache, and the recurrent layers' state after them: read from
        prefix_cache_path when stored there, else prefilled and stored. Returns how many tokens
        were read from disk (0 or len(ids)). generate() then prefills only what follows; it also
        finds a stored prefix by itself."""
        self._require_loaded()
        ids = self._check_ids(ids)
        if self.prefix_cache is None:
            raise ConfigError("not set: the prefix cache needs a folder", field="prefix_cache_path")
        if self.runtime.kv_meta.kept:
            raise InputError("cache_prefix needs an empty KV cache: call reset() first", field="input_ids")
        if self.prefix_cache.path_for(ids).is_file():
            self._restore_prefix(ids)
            return len(ids)
        self.forward(ids)
        self.prefix_cache.store(ids, self.runtime.backend(), self._state_backend())
        return 0

    def _reuse_stored_prefix(self, ids: list[int]) -> int:
        """With an empty KV cache, load the longest stored prefix of `ids`; how many tokens it held."""
        if self.prefix_cache is None or self.runtime.kv_meta.kept:
            return 0
        stored = self.prefix_cache.longest_prefix(ids)
        if stored is None:
            return 0
        self._restore_prefix(stored)
        return len(stored)

    def _restore_prefix(self, ids: list[int]) -> None:
        self.prefix_cache.restore(ids, self.cache_layout, self.runtime.backend(), self._state_backend())
        self._prefix_entered(ids)

    # ---- the server's shared prompt blocks (engine.block_cache) ---------------------------------
    def read_prefix(self, length: int) -> tuple[Layers, States]:
        """Copies of the current sequence's first `length` keys and values, and its recurrent states
        (those after every token it holds: the caller reads them where that is `length`)."""
        return read_kv(self.runtime.backend(), length), read_states(self._state_backend())

    def write_prefix(self, ids: list[int], layers: Layers, states: States) -> None:
        """Make the empty current sequence hold `ids` as these keys and values and these states."""
        if self.runtime.kv_meta.kept:
            raise InputError("write_prefix needs an empty KV cache: call reset() first", field="input_ids")
        write_kv(self.runtime.backend(), layers)
        write_states(self._state_backend(), states)
        self._prefix_entered(ids)

    def _prefix_entered(self, ids: list[int]) -> None:
        meta = self.runtime.kv_meta
        meta.previous, meta.remove, meta.reserve = len(ids), 0, []
        self.context.history_tokens.extend(ids)
        self.context.all_seq_len = len(ids)

    def _state_backend(self):
        """The backend whose state_caches hold the recurrent layers' states: the main one where it
        runs LinearAttention, else the CPU backup that placement sent the ops to."""
        main = self.runtime.backend()
        if not self.has_recurrent_layers or any(p.op_type == "LinearAttention" and p.backend == main.type
                                                for p in self.runtime.placements.entries.values()):
            return main
        return self.runtime.cpu_backup()

    @property
    def has_recurrent_layers(self) -> bool:
        """Whether the graph keeps a recurrent state (LinearAttention) beside its KV cache."""
        return any(p.op_type == "LinearAttention" for p in self.runtime.placements.entries.values())
