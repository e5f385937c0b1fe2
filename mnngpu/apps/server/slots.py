"""The server's slots: each a sequence of the one loaded Llm, generated together by a Batch.

A choice runs on a worker thread of its own, holding a slot for its whole reply. It sees the
model through SequenceView, which looks like the Llm to the chat code (choice.py, apps/chat.py)
but works on the slot's sequence: a forward, a reset or the prefix cache runs on the Batch's
stepping thread between steps, and generate() submits the reply to the Batch and waits while
the reply's tokens reach `on_token` from that thread. Every slot keeps its own PromptCache, so
with `reuse_kv` a request that continues a slot's text is given that slot. With `cache_ram` the
slots also share the prompt blocks of every earlier request (prompt_blocks.py): a prompt that
starts a slot afresh takes the blocks of its start from there before the Batch prefills the rest.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from mnngpu.apps.chat import PromptCache
from mnngpu.apps.server.prompt_blocks import PromptBlocks
from mnngpu.backend.kv import Sequence
from mnngpu.generation.batch import Batch


class SequenceView:
    """The Llm as one slot's choices see it (see the module's docstring); everything that is not
    the sequence's own (config, tokenizer, prompt, embedding ...) is the Llm's."""

    def __init__(self, batch: Batch, sequence: Sequence, prompt_blocks: PromptBlocks | None = None):
        self._batch, self._llm, self.sequence = batch, batch.llm, sequence
        self.prompt_blocks = prompt_blocks
        self.runtime = _SequenceRuntime(batch.llm.runtime, sequence)
        self.sampler = None   # the choice's, set before each reply

    def __getattr__(self, name):
        return getattr(self._llm, name)

    @property
    def context(self):
        return self.sequence.context

    def reset(self) -> None:
        self._on_sequence(self._llm.reset)

    def forward(self, ids, all_logits: bool | None = None):
        return self._on_sequence(lambda: self._llm.forward(ids, all_logits))

    def cache_prefix(self, ids) -> int:
        return self._on_sequence(lambda: self._llm.cache_prefix(ids))

    def generate(self, ids, max_new_tokens: int | None = None, on_token=None, stop_ids=None) -> list[int]:
        ids, cached, held = self._llm.token_ids(ids), 0, 0
        if self.prompt_blocks is not None and not self.sequence.meta.kept:
            cached, held = self.prompt_blocks.prefill(ids, self._on_sequence)
        request = self._batch.submit(ids[held:], max_new_tokens, self.sampler, on_token, stop_ids, self.sequence)
        tokens = request.wait().tokens
        self.sequence.context.prefix_cached += cached   # the Batch counted only what it was given
        return tokens

    def _on_sequence(self, fn):
        return self._batch.call(self.sequence, fn)


class _SequenceRuntime:
    """The Llm's runtime, with the slot's KVMeta as its kv_meta."""

    def __init__(self, runtime, sequence: Sequence):
        self._runtime, self._sequence = runtime, sequence

    @property
    def kv_meta(self):
        return self._sequence.meta

    def __getattr__(self, name):
        return getattr(self._runtime, name)


@dataclass(eq=False)
class Slot:
    view: SequenceView
    cache: PromptCache
    used: int = 0   # when it was last given out (a count), so the least recently used goes first


@dataclass
class Slots:
    """Every slot, and which are free. `take(prompt)` prefers a free slot whose cache holds the
    start of `prompt` (with reuse_kv), else the one unused longest; it blocks while none is free."""

    batch: Batch
    free: list[Slot] = field(default_factory=list)
    all: list[Slot] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)
    _count: int = 0

    prompt_blocks: PromptBlocks | None = None   # the blocks every slot shares (cache_ram), or None

    @classmethod
    def of(cls, batch: Batch) -> Slots:
        slots = cls(batch)
        slots.prompt_blocks = PromptBlocks.for_model(batch.llm)
        for sequence in batch.sequences:
            view = SequenceView(batch, sequence, slots.prompt_blocks)
            slots.all.append(Slot(view, PromptCache(view)))
        slots.free = list(slots.all)
        return slots

    @property
    def busy(self) -> int:
        return len(self.all) - len(self.free)

    def take(self, prompt: str | None) -> Slot:
        with self.changed:
            while not self.free:
                self.changed.wait()
            slot = max(self.free, key=lambda s: (self._continues(s, prompt), -s.used))
            self.free.remove(slot)
            self._count += 1
            slot.used = self._count
            return slot

    def give(self, slot: Slot) -> None:
        with self.changed:
            self.free.append(slot)
            self.changed.notify_all()

    @staticmethod
    def _continues(slot: Slot, prompt: str | None) -> bool:
        text = slot.cache.text
        return bool(prompt and text and prompt.startswith(text))
