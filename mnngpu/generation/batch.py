"""Continuous batching: several sequences generated together on one loaded Llm.

    batch = Batch(llm, slots=4)
    replies = [batch.submit(llm.tokenizer_encode(p), max_new_tokens=64) for p in prompts]
    batch.run()                     # until every reply is done; or step() one step at a time
    print([llm.tokenizer.decode_ids(r.tokens) for r in replies])

Each request holds a slot, a sequence of the Llm (Llm.new_sequence) with its own KV cache,
recurrent states, positions, history and sampler. A step first runs what other threads asked to
run on a sequence (`call`), then one prefill chunk of one request (the Llm's own chunking, so a
prompt is prefilled exactly as `generate` would), then one forward over the decode rows of every
request that has a token to feed: each weight is read once per step for all of them. A request
that ends, or is cancelled, frees its slot at the end of that step; the next waiting one takes it.
With one slot nothing is batched: its decode row is the Llm's own decode step, as in `generate`,
so a model that cannot batch (one_sequence_only) is served that way.

A reply follows `Llm.generate`'s rules, so a greedy reply is the one the prompt gets alone: it
ends on a stop id (not kept), on `on_token` returning True ("cancelled"), at max_new_tokens
("length") or at max_all_tokens; every emitted token but a stop id enters the cache (a reply
that did not end on a stop id feeds its last token in one more row, its logits unused). The
decode rows of a step go in forwards of at most BATCH_ROWS rows: up to there the CPU's linear
layers run the same GEMV arithmetic for each row as for a lone decode step (from 9 rows on they
dequantize and multiply, rounding differently).

The Python API runs steps on the caller's thread (`run`, `step`); a server runs `serve` on a
thread of its own, and other threads `submit` and `call` (both thread-safe).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from mnngpu.backend import backend_class
from mnngpu.backend.kv import Sequence
from mnngpu.errors import ConfigError, InputError
from mnngpu.ops import linear_attention
from mnngpu.sampler import Sampler

BATCH_ROWS = 8   # decode rows per forward (see the module's docstring)
# A server's slots by default: on 2 cores, 4 decode rows a step give 2.5-3x one stream's tokens for
# a 0.5B model while each stream keeps most of its speed; more rows mostly add latency.
DEFAULT_SLOTS = 4


@dataclass(eq=False)
class BatchRequest:
    """One prompt's reply in a Batch. `tokens` grows as it is generated; `done` is set at the end,
    with `finish_reason` "stop", "length" or "cancelled", or `error` where a forward failed."""

    ids: list[int]
    max_new_tokens: int
    sampler: object
    on_token: Callable[[int], bool | None] | None = None
    stop_ids: frozenset[int] | None = None   # None: the tokenizer's
    sequence: Sequence | None = None          # the slot; None: a free one, given when it starts
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    prefix_cached: int = 0   # prompt tokens the prefix cache gave
    _pending: list[list[int]] = field(default_factory=list)   # prefill chunks still to run
    _feed: int | None = None      # the token the next decode row feeds
    _flush: bool = False          # that row only puts the last token in the cache
    _history: list[int] = field(default_factory=list)
    _cancelled: bool = False
    _owns_slot: bool = False      # given a free slot at its start, returned at its end
    _clock: float = 0.0

    def cancel(self) -> None:
        """End the reply at the next step ("cancelled"), freeing its slot."""
        self._cancelled = True

    def wait(self, timeout: float | None = None) -> BatchRequest:
        """Block until done; raise what failed it."""
        self.done.wait(timeout)
        if self.error is not None:
            raise self.error
        return self


def one_sequence_only(llm) -> str | None:
    """Why `llm` cannot batch several sequences, or None where it can."""
    backend = llm.config.backend_type
    caps = backend_class(backend).caps
    if not caps.batched:
        return f"batching is not implemented on the {backend} backend"
    if not caps.batched_state and any(p.op_type == "LinearAttention" for p in llm.runtime.placements.entries.values()):
        return linear_attention.batching_declined(backend)
    if llm.strategy.name != "ar":
        return f"speculative_type {llm.config.get('speculative_type')!r} decodes one sequence at a time"
    if llm.config.get("is_visual") or llm.config.get("is_audio"):
        return "batching multimodal models is not implemented (their positions follow the images)"
    return None


def default_slots(llm) -> int:
    """Slots for a server on this machine: DEFAULT_SLOTS where the model batches, else 1."""
    return 1 if one_sequence_only(llm) else DEFAULT_SLOTS


class Batch:
    def __init__(self, llm, slots: int = 4):
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise InputError(f"expected a whole number of slots of at least 1, got {slots!r}", field="parallel")
        why = one_sequence_only(llm)
        if slots > 1 and why:
            raise ConfigError(f"{slots} slots: {why}; use 1", field="parallel")
        self.llm = llm
        self.slots = slots
        llm.batch_width = slots   # a fixed-shape backend's batched decode module has a row per slot
        self.sequences = [llm.sequence] + [llm.new_sequence() for _ in range(slots - 1)]   # one per slot
        self._free = list(self.sequences)
        self._active: list[BatchRequest] = []
        self._waiting: deque[BatchRequest] = deque()
        self._calls: deque[tuple[Sequence, Callable, Future]] = deque()
        self._lock = threading.Condition()
        self._closed = False
        self._stepper: threading.Thread | None = None   # the thread that steps, once run() or serve() starts

    # ---- any thread ------------------------------------------------------------------------------
    def submit(self, ids, max_new_tokens: int | None = None, sampler=None, on_token=None, stop_ids=None,
               sequence: Sequence | None = None) -> BatchRequest:
        """Queue a reply to `ids`. `sampler`: a fresh one from the config when None; `on_token(token)`
        hears each emitted token on the stepping thread (True: end the reply); `sequence`: a slot
        the caller holds (see `take_slot`), whose cache it continues, else any free slot, emptied."""
        limit = self.llm.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0:
            raise InputError(f"expected a non-negative integer, got {limit!r}", field="max_new_tokens")
        request = BatchRequest(self.llm.token_ids(ids), int(limit),
                               sampler if sampler is not None else Sampler(self.llm.config.raw), on_token,
                               None if stop_ids is None else frozenset(stop_ids), sequence)
        with self._lock:
            self._waiting.append(request)
            self._lock.notify_all()
        return request

    def call(self, sequence: Sequence, fn: Callable[[], object]) -> object:
        """Run fn() between steps with `sequence` current on the Llm (a forward, a reset, the prefix
        cache) and return what it returns; from the stepping thread itself, at once."""
        if threading.current_thread() is self._stepper:
            self.llm.use_sequence(sequence)
            return fn()
        future: Future = Future()
        with self._lock:
            self._calls.append((sequence, fn, future))
            self._lock.notify_all()
        return future.result()

    def take_slot(self, timeout: float | None = None) -> Sequence | None:
        """Hold a free slot (a sequence) for a caller's requests until `give_slot`; None after
        `timeout` seconds, or once the batch is closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not self._free and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._lock.wait(left)
            return None if self._closed else self._free.pop()

    def give_slot(self, sequence: Sequence) -> None:
        with self._lock:
            self._free.append(sequence)
            self._lock.notify_all()

    @property
    def running(self) -> int:
        """Requests holding a slot now."""
        return len(self._active)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def cache_bytes(self) -> int:
        """Bytes every slot's caches hold."""
        return sum(sequence.nbytes() for sequence in self.sequences)

    def close(self) -> None:
        """Stop serve(): the requests not done are cancelled."""
        with self._lock:
            self._closed = True
            for request in [*self._active, *self._waiting]:
                request.cancel()
            self._lock.notify_all()

    def warm(self) -> None:
        """Run one batched decode step of each width the slots can take, on empty slots, and clear
        them: the modules are resized and their kernels bound now, not in a client's first steps."""
        current = self.llm.sequence
        for width in range(2, min(self.slots, BATCH_ROWS) + 1):
            self.llm.decode_rows(self.sequences[:width], [0] * width)
        for sequence in self.sequences:
            self.llm.use_sequence(sequence)
            self.llm.reset()
        self.llm.use_sequence(current)

    # ---- the stepping thread ---------------------------------------------------------------------
    def run(self) -> None:
        """Step until every submitted request is done."""
        self._stepper = threading.current_thread()
        while self.step():
            pass

    def serve(self) -> None:
        """Step whenever there is work, until close() (a server's stepping thread)."""
        self._stepper = threading.current_thread()
        while True:
            with self._lock:
                while not (self._calls or self._waiting or self._active or self._closed):
                    self._lock.wait()
                if self._closed and not self._active and not self._calls:
                    self._cancel_waiting()
                    return
            try:
                self.step()
            except BaseException as exc:   # the stepping thread goes on: what was running fails with it
                for request in list(self._active):
                    if not request.done.is_set():
                        self._fail(request, exc)
                self._retire()

    def step(self) -> bool:
        """One step; whether any work is left."""
        self._run_calls()
        self._admit()
        self._prefill_one()
        self._decode()
        self._retire()
        with self._lock:
            return bool(self._active or self._waiting or self._calls)

    def _run_calls(self) -> None:
        while True:
            with self._lock:
                if not self._calls:
                    return
                sequence, fn, future = self._calls.popleft()
            try:
                self.llm.use_sequence(sequence)
                future.set_result(fn())
            except BaseException as exc:   # the caller's thread raises it
                future.set_exception(exc)

    def _admit(self) -> None:
        started = []
        with self._lock:
            while self._waiting:
                request = self._waiting[0]
                if request.sequence is None and not request._cancelled:
                    if not self._free:
                        break
                    request.sequence, request._owns_slot = self._free.pop(), True
                self._waiting.popleft()
                if request._cancelled:
                    self._finish(request, "cancelled")
                    self._return_slot(request)
                    continue
                self._active.append(request)
                started.append(request)
        for request in started:
            self._start(request)

    def _start(self, request: BatchRequest) -> None:
        """Mirror the start of Llm.generate in the request's sequence: its history, a stored prefix."""
        llm = self.llm
        llm.use_sequence(request.sequence)
        if request._owns_slot:
            llm.reset()
        try:
            request.prefix_cached = llm._reuse_stored_prefix(request.ids)
        except BaseException as exc:
            self._fail(request, exc)
            return
        request._history = list(llm.context.history_tokens) + request.ids[request.prefix_cached:]
        context = llm.context
        context.prompt_len, context.prefix_cached, context.gen_seq_len = len(request.ids), request.prefix_cached, 0
        context.output_tokens = []
        rest = request.ids[request.prefix_cached:]
        # forward() chunks a prompt itself; one chunk a step lets the decode rows run between them
        size = len(rest) if llm.runtime.fixed_shape else llm._rows_per_run(len(rest))
        request._pending = [rest[i: i + size] for i in range(0, len(rest), size)]
        request._clock = time.perf_counter()
        if request.max_new_tokens == 0:
            request._pending = []
            self._finish(request, "length")

    def _prefill_one(self) -> None:
        request = next((r for r in self._active if r._pending and not r.done.is_set()), None)
        if request is None:
            return
        if request._cancelled:
            self._finish(request, "cancelled")
            return
        llm = self.llm
        llm.use_sequence(request.sequence)
        try:
            logits = llm._finite(np.asarray(llm.forward(request._pending.pop(0), all_logits=False))[0, -1])
        except BaseException as exc:
            self._fail(request, exc)
            return
        if not request._pending:
            self._timed(request, "prefill_us")
            self._take(request, logits)

    def _decode(self) -> None:
        rows = [r for r in self._active if r._feed is not None and not r.done.is_set()]
        for start in range(0, len(rows), BATCH_ROWS):
            group = rows[start: start + BATCH_ROWS]
            try:
                logits = self._decode_logits(group)
            except BaseException as exc:
                for request in group:
                    self._fail(request, exc)
                continue
            for request, row in zip(group, logits):
                self._timed(request, "decode_us")
                if request._flush:
                    self._finish(request, request.finish_reason)
                elif request._cancelled:
                    self._end(request, "cancelled")
                else:
                    self._take(request, self.llm._finite(row))

    def _decode_logits(self, group: list[BatchRequest]) -> np.ndarray:
        """Logits [rows, vocab] of one decode step of each request in `group`. With one slot the
        step is the Llm's own (Llm.generate's decode module), not a batched forward, which a model
        that cannot batch (one_sequence_only: recurrent layers on a device ...) would be refused."""
        if self.slots == 1:
            request, = group
            self.llm.use_sequence(request.sequence)
            return np.asarray(self.llm.forward([request._feed], all_logits=False))[0]
        return self.llm.decode_rows([r.sequence for r in group], [r._feed for r in group])

    def _take(self, request: BatchRequest, logits: np.ndarray) -> None:
        """Sample the next token and apply Llm.generate's rules for how a reply ends."""
        try:   # a sampler's grammar, or a caller's on_token, may fail: it fails this request alone
            token = int(request.sampler.sample(logits, request._history))
            request._history.append(token)
            stops = request.stop_ids
            if (self.llm.tokenizer.is_stop(token) if stops is None else token in stops):
                self._finish(request, "stop")
                return
            request.tokens.append(token)
            stop = bool(request.on_token(token)) if request.on_token is not None else False
        except BaseException as exc:
            self._fail(request, exc)
            return
        if stop or request._cancelled:
            self._end(request, "cancelled")
        elif len(request.tokens) >= request.max_new_tokens or len(request._history) > self.llm.config.max_all_tokens:
            self._end(request, "length")
        else:
            request._feed = token

    def _end(self, request: BatchRequest, reason: str) -> None:
        """The reply ends after its last token: fed in one more row where the cache has room."""
        request.finish_reason = reason
        if request.tokens and request.sequence.meta.kept + 1 <= self.llm.config.max_all_tokens:
            request._feed, request._flush = request.tokens[-1], True
        else:
            self._finish(request, reason)

    def _timed(self, request: BatchRequest, key: str) -> None:
        now = time.perf_counter()
        context = request.sequence.context
        setattr(context, key, getattr(context, key) + int((now - request._clock) * 1e6))
        request._clock = now

    def _fail(self, request: BatchRequest, error: BaseException) -> None:
        request.error = error
        self.llm.use_sequence(request.sequence)
        self.llm.reset()   # a forward cut short leaves the cache in no state we can name
        self._finish(request, "error")

    def _finish(self, request: BatchRequest, reason: str) -> None:
        request.finish_reason = reason
        request._feed, request._pending = None, []
        if request.sequence is not None and request.sequence.context is not None:
            request.sequence.context.gen_seq_len = len(request.tokens)
            request.sequence.context.output_tokens = list(request.tokens)
        request.done.set()

    def _retire(self) -> None:
        """Free the slots of the requests done this step."""
        with self._lock:
            for request in [r for r in self._active if r.done.is_set()]:
                self._active.remove(request)
                self._return_slot(request)
            self._lock.notify_all()

    def _return_slot(self, request: BatchRequest) -> None:
        if request._owns_slot:
            self._free.append(request.sequence)
            request._owns_slot = False

    def _cancel_waiting(self) -> None:
        while self._waiting:
            self._finish(self._waiting.popleft(), "cancelled")


__all__ = ["BATCH_ROWS", "DEFAULT_SLOTS", "Batch", "BatchRequest", "default_slots", "one_sequence_only"]
