"""ServedModel: one loaded Llm behind a queue, so requests take turns with its KV cache.

Every request becomes a Job that runs on the one worker thread, in arrival order: each of its
prompts, n times, one choice after another (choice.py). Before a choice runs, the KV cache is
either cleared or, with `reuse_kv`, kept because the new prompt starts with exactly the text the
cache holds (see mnngpu/apps/chat.py). Each job gets a fresh sampler built from the model's
config and the request's settings, so no setting or random state carries over to the next
request. A job whose client went away is cancelled: it stops after the current token, or never
starts if it was still waiting. `max_queue` bounds the jobs waiting behind the running one; once
the server is stopping, new jobs are refused. Its counts for GET /metrics are in `metrics`
(metrics.py): every job's usage, and the time of each token its sampler gives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from mnngpu.apps.chat import PromptCache
from mnngpu.apps.server.choice import Choice, ChoiceRun, Piece
from mnngpu.apps.server.logprobs import RequestSampler
from mnngpu.apps.server.metrics import ModelMetrics
from mnngpu.apps.server.protocol import (
    ApiError,
    GenerationRequest,
    PromptInput,
    Usage,
    is_token_ids,
    sampler_overrides,
)
from mnngpu.errors import InputError, MnnGpuError
from mnngpu.sampler import Sampler

DEFAULT_MAX_QUEUE = 32


@dataclass
class Result:
    choices: list[Choice]
    usage: Usage

    @property
    def text(self) -> str:
        """The first choice's text (the only one, unless the request asked for n > 1 or several prompts)."""
        return self.choices[0].text


@dataclass
class Job:
    prompts: list[PromptInput]
    request: GenerationRequest
    sampler: RequestSampler
    on_text: Callable[[Piece], None] | None = None   # called on the worker thread with each piece to send
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)   # when the request was read

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
        self.metrics = ModelMetrics(self)

    @property
    def waiting(self) -> int:
        """Jobs in the queue, not started yet."""
        return self._waiting

    @property
    def running(self) -> int:
        """Jobs being generated: 0 or 1."""
        return int(self._running is not None)

    # ---- called from the server's event loop --------------------------------------------------------
    def chat_prompt(self, messages: list[dict]) -> str:
        try:
            return self.llm.apply_chat_template(messages)
        except MnnGpuError as exc:
            raise ApiError(400, str(exc), param="messages") from None

    def new_job(self, prompts: PromptInput | list[PromptInput], request: GenerationRequest) -> Job:
        """A job with its own sampler. A bad sampler setting, token id or logit_bias, or a prompt
        with no room for a reply, is refused here, before any reply (or stream) starts."""
        prompts = [prompts] if isinstance(prompts, str) or is_token_ids(prompts) else list(prompts)
        config = self.llm.config.raw
        try:
            sampler = Sampler({**config, **sampler_overrides(request, config)})
            if request.images and not self.llm.config.get("is_visual"):
                raise InputError("this model reads no images (is_visual is false)", field="messages")
            if request.audios and not self.llm.config.get("is_audio"):
                raise InputError("this model reads no audio (is_audio is false)", field="messages")
            counts = [self._prompt_tokens(prompt, request) for prompt in prompts]
        except MnnGpuError as exc:
            raise ApiError(400, str(exc), param=exc.field) from None
        self._check_token_ids(request.logit_bias, "logit_bias")
        limit = self.llm.config.max_all_tokens
        for prompt_tokens in counts:
            if prompt_tokens >= limit:
                raise ApiError(400, f"the prompt's {prompt_tokens} tokens leave no room for a reply within "
                                    f"max_all_tokens={limit}", param=request.prompt_param,
                               code="context_length_exceeded")
        top = request.logprobs
        return Job(prompts, request, RequestSampler(sampler, request.logit_bias, request.presence_penalty,
                                                    request.frequency_penalty, top))

    def _prompt_tokens(self, prompt: PromptInput, request: GenerationRequest) -> int:
        if isinstance(prompt, str):
            return self.llm.count_prompt_tokens(prompt, request.media)
        self._check_token_ids(prompt, "prompt")
        return len(prompt)

    def _check_token_ids(self, ids, param: str) -> None:
        vocab = self.llm.embedding.vocab_size
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise ApiError(400, f"token id {bad} is outside the vocabulary [0, {vocab})", param=param)

    def tokenizer_info(self) -> dict:
        """What a client needs to tokenize as the server does (GET /tokenizer_info)."""
        tokenizer, prompt = self.llm.tokenizer, self.llm.prompt
        eos = next((tokenizer.decode(i) for i in tokenizer.stop_ids), None)
        return {"model": self.name, "vocab_size": self.llm.embedding.vocab_size,
                "eos_token": prompt.eos or tokenizer.eos_token or eos, "eos_token_ids": list(tokenizer.stop_ids),
                "bos_token": prompt.bos or tokenizer.bos_token or None, "prefix_token_ids": list(tokenizer.prefix_ids),
                "chat_template": self.chat_template()}

    def chat_template(self) -> str | None:
        return self.llm.prompt.template_source or None

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
            return self._record(Result([Choice(0, "", "cancelled", None, Usage(0, 0))], Usage(0, 0)))
        run = ChoiceRun(self.llm, self.cache, job.request, job.sampler, self.show_special,
                        lambda: job.cancelled.is_set() or self._stopping, job.on_text)
        choices: list[Choice] = []
        clock = self.metrics.token_clock(job.sampler, job.arrived)
        self.llm.sampler = clock
        self._running = job
        try:
            with self.llm.media_sources(job.request.media):
                for number, prompt in enumerate(job.prompts):
                    for index in range(number * job.request.n, (number + 1) * job.request.n):
                        clock.next_choice()
                        choices.append(self._choice(run, prompt, index))
        except MnnGpuError as exc:
            code = "context_length_exceeded" if exc.field == "max_all_tokens" else None
            param = job.request.prompt_param if exc.field == "input_ids" else exc.field
            raise ApiError(400, str(exc), param=param, code=code) from None
        finally:
            self._running = None
        return self._record(Result(choices, _total_usage(choices, job.request.n)))

    def _choice(self, run: ChoiceRun, prompt: PromptInput, index: int) -> Choice:
        if run.should_stop():
            run.send(Piece(index, finish_reason="cancelled"))
            return Choice(index, "", "cancelled", None, Usage(0, 0))
        return run.run(prompt, index)

    def _record(self, result: Result) -> Result:
        self.metrics.record_usage(result.usage)
        with self.stats.done:
            self.stats.finished += 1
            self.stats.cancelled += any(choice.finish_reason == "cancelled" for choice in result.choices)
            self.stats.completion_tokens += result.usage.completion_tokens
            self.stats.done.notify_all()
        return result


def _total_usage(choices: list[Choice], n: int) -> Usage:
    """Each prompt's tokens once (its first choice's), every choice's generated tokens."""
    firsts = [choice.usage for choice in choices if choice.index % n == 0]
    return Usage(sum(u.prompt_tokens for u in firsts), sum(c.usage.completion_tokens for c in choices),
                 sum(u.cached_tokens for u in firsts))


class ModelSlot:
    """The served model, once loaded. Until then every request but GET /health gets 503
    (`code: "model_loading"`), so a server can answer while its model loads."""

    def __init__(self, served: ServedModel | None = None):
        self.served = served
        self.stopping = False

    @property
    def model(self) -> ServedModel:
        if self.served is None:
            raise ApiError(503, "the model is still loading; GET /health answers 200 once it is ready",
                           kind="server_error", code="model_loading")
        return self.served

    def ready(self, served: ServedModel) -> None:
        self.served = served
        if self.stopping:
            served.stop()

    def stop(self) -> None:
        self.stopping = True
        if self.served is not None:
            self.served.stop()

    def close(self) -> None:
        if self.served is not None:
            self.served.close()
