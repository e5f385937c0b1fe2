"""ModulePool: the prefill, decode and verify modules an Llm switches between.

As in MNN: the prefill module is keyed (prefill_len, all_logits), the decode module is a
clone keyed (1, False), and a speculative strategy adds a verify clone keyed
(verify_length, True) that returns every row's logits. Clones share the packed weights and the
KV cache. A fixed-shape backend resizes each one once; prompts are then fed in chunks of
prefill_len, and a verify block is always verify_length ids. There a short prompt, or a
prompt's last short piece, runs through the smallest of the prefill widths that holds it
(prefill_widths) rather than being padded to prefill_len rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mnngpu.backend.widths import PREFILL_LEN

if TYPE_CHECKING:
    from mnngpu.runtime.module import NetModule

# What one more forward costs beyond its rows, in rows: on lavapipe a forward's fixed cost is that of
# about 5 rows; a GPU's launches cost more. Two 32-row forwards (80) beat one of 100 rows (108).
FORWARD_ROWS = 8


class ModulePool:
    """The modules by (kind, rows, all_logits): kind "prefill" (one per width), "decode" (one row),
    "verify" (a speculative block's rows) and "rows" (a batched decode step of one row per sequence),
    so no two kinds of the same rows share a module, whose resized pipeline is its kind's."""

    def __init__(self, prefill: NetModule, all_logits: bool, verify_length: int = 0,
                 widths: tuple[int, ...] = (PREFILL_LEN,)):
        self.modules: dict[tuple[str, int, bool], NetModule] = {("prefill", PREFILL_LEN, all_logits): prefill,
                                                                ("decode", 1, False): prefill.clone()}
        self.all_logits = all_logits
        self.verify_length = verify_length
        self.widths = widths
        if verify_length:
            self.modules[("verify", verify_length, True)] = prefill.clone()
        for width in widths:   # every module made now, so the load-time placement covers them all
            self.modules.setdefault(("prefill", width, all_logits), prefill.clone())

    def width(self, seq_len: int) -> int:
        """The rows of the prefill module that runs `seq_len` ids: the smallest width that holds
        them (a shape-mutable backend has the one width, and its module takes any length)."""
        return next((width for width in self.widths if width >= seq_len), self.widths[-1])

    def pieces(self, count: int, size: int) -> list[int]:
        """How many ids each forward of a fixed-shape prefill of `count` ids takes: chunks of `size`
        (the last one shorter), each cut into pieces of the one width that computes it cheapest
        (padded rows plus FORWARD_ROWS a forward; on a tie the fewer forwards)."""
        whole, rest = divmod(count, size)
        chunks = [size] * whole + ([rest] if rest else [])
        return [piece for chunk in chunks for piece in self._split(chunk)]

    def _split(self, chunk: int) -> list[int]:
        def cost(step: int) -> tuple[int, int]:
            forwards = -(-chunk // step)
            return forwards * (self.width(step) + FORWARD_ROWS), forwards

        step = min(sorted({min(width, chunk) for width in self.widths}), key=cost)
        forwards = -(-chunk // step)
        return [step] * (forwards - 1) + [chunk - step * (forwards - 1)]

    def _module(self, key: tuple[str, int, bool]) -> NetModule:
        if key not in self.modules:
            self.modules[key] = self.modules[("decode", 1, False)].clone()
        return self.modules[key]

    def select(self, seq_len: int, all_logits: bool) -> NetModule:
        if seq_len == 1 and not all_logits:
            return self.modules[("decode", 1, False)]
        return self._module(("prefill", self.width(seq_len), all_logits))

    def rows(self, count: int) -> NetModule:
        """The module of a batched decode step of `count` rows (one per sequence), every row's
        logits: one clone per count, so each keeps its resized pipeline."""
        return self._module(("rows", count, True))

    def verify(self) -> NetModule:
        return self.modules[("verify", self.verify_length, True)]
