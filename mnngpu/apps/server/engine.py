"""ServedModel: one loaded Llm behind a queue, so requests take turns with its KV cache.

Every request becomes a Job that runs on the one worker thread, in arrival order. Before it
runs, the KV cache is either cleared or, with `reuse_kv`, kept because the new prompt starts
with exactly the text the cache holds (see mnngpu/apps/chat.py). Each job gets a fresh Sampler
built from the model's config and the request's overrides, so no setting or random state
carries over to the next request. A job whose client went away is cancelled: it stops after
the current token, or never starts if it was still waiting. `max_queue` bounds the jobs
waiting behind the running one; once the server is stopping, new jobs are refused.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from mnngpu.apps.chat import PromptCache, generate_reply, system_prefix
from mnngpu.apps.server.protocol import ApiError, GenerationRequest, Usage, sampler_overrides
from mnngpu.apps.server.stop import StopMatcher
from mnngpu.errors import InputError, MnnGpuError
from mnngpu.sampler import Sampler

DEFAULT_MAX_QUEUE = 32


@dataclass
class Result:
    text: str
    finish_reason: str   # "stop", "length" or "cancelled" (the client went away)
    usage: Usage


@dataclass
class Job:
    prompt: str
    request: GenerationRequest
    sampler: Sampler
    on_text: Callable[[str], None] | None = None   # called on the worker thread with each piece to send
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class ServedStats:
    """What the worker has done, for logs and tests."""

    finished: int = 0
    cancelled: int = 0
    completion_tokens: int = 0
    done: threading.Condition = field(default_factory=threading.Condition)


class ServedModel:
    def __init__(self, llm, name: str, max_queue: int = DEFAULT_MAX_QUEUE, created: int = 0,
                 show_special: bool = False):
        if max_queue < 1:
            raise InputError(f"expected at least 1, got {max_queue}", field="max_queue")
        self.llm = llm
        self.name = name
        self.created = created  # the model's time, as the model list shows it
        self.max_queue = max_queue
        self.show_special = show_special
        self.cache = PromptCache(llm)
        self.stats = ServedStats()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mnngpu-generate")
        self._lock = threading.Lock()
        self._waiting = 0
        self._running: Job | None = None
        self._stopping = False

    # ---- called from the server's event loop --------------------------------------------------------
    def chat_prompt(self, messages: list[dict]) -> str:
        try:
            return self.llm.apply_chat_template(messages)
        except MnnGpuError as exc:
            raise ApiError(400, str(exc), param="messages") from None

    def new_job(self, prompt: str, request: GenerationRequest) -> Job:
        """A job with its own sampler. A bad sampler setting, or a prompt with no room for a reply,
        is refused here, before any reply (or stream) starts."""
        config = self.llm.config.raw
        try:
            sampler = Sampler({**config, **sampler_overrides(request, config)})
            if request.images and not self.llm.config.get("is_visual"):
                raise InputError("this model reads no images (is_visual is false)", field="messages")
            if request.audios and not self.llm.config.get("is_audio"):
                raise InputError("this model reads no audio (is_audio is false)", field="messages")
            prompt_tokens = self.llm.count_prompt_tokens(prompt, request.media)
        except MnnGpuError as exc:
            raise ApiError(400, str(exc), param=exc.field) from None
        limit = self.llm.config.max_all_tokens
        if prompt_tokens >= limit:
            raise ApiError(400, f"the prompt's {prompt_tokens} tokens leave no room for a reply within "
                                f"max_all_tokens={limit}", param="messages" if request.messages else "prompt",
                           code="context_length_exceeded")
        return Job(prompt, request, sampler)

    def submit(self, job: Job) -> Future:
        with self._lock:
            if self._stopping:
                raise ApiError(503, "the server is shutting down", kind="server_error", code="server_stopping")
            if self._waiting >= self.max_queue:
                raise ApiError(503, f"{self._waiting} requests are already waiting; try again later",
                               kind="server_error", code="server_busy")
            self._waiting += 1
        future = self._worker.submit(self._run, job)
        future.add_done_callback(self._dropped_unstarted)
        return future

    def stop(self) -> None:
        """Refuse new jobs; the running one ends after its current token, the waiting ones never start."""
        with self._lock:
            self._stopping = True
        running = self._running
        if running is not None:
            running.cancel()

    def close(self) -> None:
        """Stop, and wait for the worker to end."""
        self.stop()
        self._worker.shutdown(wait=True, cancel_futures=True)

    def _dropped_unstarted(self, future: Future) -> None:
        if future.cancelled():
            self._left_waiting()

    def _left_waiting(self) -> None:
        with self._lock:
            self._waiting -= 1

    # ---- on the worker thread ------------------------------------------------------------------------
    def _run(self, job: Job) -> Result:
        self._left_waiting()
        if job.cancelled.is_set() or self._stopping:
            return self._record(Result("", "cancelled", Usage(0, 0)))
        stops = StopMatcher(job.request.stop)

        def on_text(piece: str) -> bool:
            sendable = stops.feed(piece)
            if sendable and job.on_text is not None:
                job.on_text(sendable)
            return stops.hit or job.cancelled.is_set() or self._stopping

        self.llm.sampler = job.sampler
        self._running = job
        try:
            with self.llm.media_sources(job.request.media):
                reply = generate_reply(self.llm, self.cache, job.prompt, job.request.max_tokens, on_text,
                                       show_special=self.show_special,
                                       prefix=system_prefix(self.llm, job.request.messages))
        except MnnGpuError as exc:
            code = "context_length_exceeded" if exc.field == "max_all_tokens" else None
            raise ApiError(400, str(exc), param=exc.field, code=code) from None
        finally:
            self._running = None
        rest = stops.flush()
        if rest and job.on_text is not None:
            job.on_text(rest)
        finish = "stop" if stops.hit else reply.finish_reason
        usage = Usage(reply.prompt_tokens, len(reply.token_ids), reply.cached_tokens)
        return self._record(Result(stops.text, finish, usage))

    def _record(self, result: Result) -> Result:
        with self.stats.done:
            self.stats.finished += 1
            self.stats.cancelled += result.finish_reason == "cancelled"
            self.stats.completion_tokens += result.usage.completion_tokens
            self.stats.done.notify_all()
        return result
