"""The prefix cache (prefix_cache_path): a prompt's start prefilled once, its KV rows and
recurrent states stored on disk and read back instead of prefilled."""

from __future__ import annotations

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
        meta = self.runtime.kv_meta
        meta.previous, meta.remove, meta.reserve = len(ids), 0, []
        self.context.history_tokens.extend(ids)
        self.context.all_seq_len = len(ids)

    def _state_backend(self):
        """The backend whose state_caches hold the recurrent layers' states: the main one where it
        runs LinearAttention, else the CPU backup that placement sent the ops to."""
        main = self.runtime.backend()
        if not self.cache_layout.states or any(p.op_type == "LinearAttention" and p.backend == main.type
                                               for p in self.runtime.placements.entries.values()):
            return main
        return self.runtime.cpu_backup()
