"""ServedModel: one loaded Llm serving many requests at once, each choice in a slot of its own.

The model holds `parallel` slots (apps/server/slots.py), sequences of the Llm that one Batch
(mnngpu/generation/batch.py) decodes together, every weight read once per step for all of
them. Every request becomes a Job; each of its prompts, n times, is a choice (choice.py) that
runs on a worker thread while it holds a slot, so n > 1 runs as n sequences. Before a choice
runs, its slot's KV cache is either cleared or, with `reuse_kv`, kept because the new prompt
starts with exactly the text the slot holds (see mnngpu/apps/chat.py); a request is given such a
slot where one is free. Each choice gets a fresh sampler built from the model's config and the
request's settings, so no setting or random state carries over to another request. A job whose
client went away is cancelled: its choices stop after the current token, freeing their slots, or
never start if they were still waiting. `max_queue` bounds the jobs waiting for a slot; once the
server is stopping, new jobs are refused. Its counts for GET /metrics are in `metrics`
(metrics.py): every job's usage, and the time of each token its samplers give. For a model that
thinks (reasoning.py), a chat reply is split into reasoning and answer (`reasoning_format`
"auto"; "none" leaves it whole) and its block bounded by `reasoning_budget` tokens (-1: none).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from copy import deepcopy
from dataclasses import dataclass, field

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
from mnngpu.apps.server.reasoning import (
    REASONING_FORMATS,
    BudgetSampler,
    detect_thinking,
    reasoning_plan,
    template_variables,
)
from mnngpu.apps.server.slots import Slots
from mnngpu.config.llm_config import ConfigWarning
from mnngpu.errors import InputError, MnnGpuError
from mnngpu.generation.batch import Batch
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


@dataclass(eq=False)
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


def _say_no_speculation(llm) -> None:
    """The server decodes one token per forward whatever the folder's speculative_type: say so once."""
    if llm.strategy.name != "ar":
        warnings.warn(f"{llm.config.origin('speculative_type')}: speculative_type "
                      f"{llm.config.get('speculative_type')!r} is not used by the server, which decodes one "
                      "token per forward (run, chat and bench speculate)", ConfigWarning, stacklevel=3)


class ServedModel:
    def __init__(self, llm, name: str, max_queue: int = DEFAULT_MAX_QUEUE, created: int = 0,
                 show_special: bool = False, parallel: int = 1, reasoning_format: str = "auto",
                 reasoning_budget: int = -1):
        if max_queue < 1:
            raise InputError(f"expected at least 1, got {max_queue}", field="max_queue")
        if reasoning_format not in REASONING_FORMATS:
            raise InputError(f"expected one of {list(REASONING_FORMATS)}, got {reasoning_format!r}",
                             field="reasoning_format")
        if reasoning_budget < -1:
            raise InputError(f"expected -1 (no bound) or more, got {reasoning_budget}", field="reasoning_budget")
        self.reasoning_format, self.reasoning_budget = reasoning_format, reasoning_budget
        self.thinking = detect_thinking(llm.prompt, llm.tokenizer)
        self.llm = llm
        self.name = name
        self.created = created  # the model's time, as the model list shows it
        self.max_queue = max_queue
        self.show_special = show_special
        self.batch = Batch(llm, parallel)
        _say_no_speculation(llm)
        self.batch.warm()
        self.slots = Slots.of(self.batch)
        self.cache = self.slots.all[0].cache   # the chat markup (stop ids, turn openings) every slot shares
        self.stats = ServedStats()
        self._workers = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="mnngpu-choice")
        self._stepper = threading.Thread(target=self.batch.serve, name="mnngpu-batch", daemon=True)
        self._stepper.start()
        self._lock = threading.Lock()
        self._jobs: dict[Job, bool] = {}   # every job not done -> whether a choice of it has started
        self._stopping = False
        self.metrics = ModelMetrics(self)

    @property
    def parallel(self) -> int:
        return self.batch.slots

    @property
    def waiting(self) -> int:
        """Jobs in the queue, none of their choices started yet."""
        return sum(not started for started in list(self._jobs.values()))

    @property
    def running(self) -> int:
        """Jobs being generated."""
        return sum(started for started in list(self._jobs.values()))

    def kv_tokens(self) -> int:
        """Tokens every slot's KV cache holds."""
        return sum(sequence.meta.previous for sequence in self.batch.sequences)

    def kv_capacity(self) -> int:
        """Tokens the slots' caches have room for now (a slot's: its least roomy layer's, on the backend)."""
        backend = self.llm.runtime.backend()
        return sum(min((cache.capacity for cache in sequence.caches_on(backend)[0].values()), default=0)
                   for sequence in list(self.batch.sequences))

    # ---- called from the server's event loop --------------------------------------------------------
    def chat_prompt(self, messages: list[dict], request: GenerationRequest | None = None) -> str:
        """The chat's prompt text; the request's tools (unless tool_choice is "none") reach the chat
        template as its `tools`, as transformers passes them, and its chat_template_kwargs (with
        reasoning_effort) as variables. Sets the request's reasoning plan (None: not split)."""
        if request is None:
            return self.llm.apply_chat_template(messages)
        tools = request.tools
        rendered = None if tools is None else tools.in_prompt
        variables = template_variables(self.thinking, request)
        try:
            if rendered is None and not variables:
                prompt = self.llm.apply_chat_template(messages)
            else:
                if rendered is not None:
                    tools.check_template(self.chat_template())
                prompt = self.llm.prompt.apply_chat_template(messages, tools=rendered, variables=variables)
        except MnnGpuError as exc:
            raise ApiError(400, str(exc), param="tools" if exc.field == "tools" else "messages") from None
        request.reasoning = reasoning_plan(self.thinking, prompt, request, self.reasoning_format,
                                           self.reasoning_budget)
        return prompt

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
            grammar = None if request.grammar is None else request.grammar.compile(self.llm.tokenizer,
                                                                                   self.cache.markup.stop_ids)
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
                                                    request.frequency_penalty, top, grammar))

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
            if self.waiting >= self.max_queue:
                raise ApiError(503, f"{self.waiting} requests are already waiting; try again later",
                               kind="server_error", code="server_busy")
            self._jobs[job] = False
        run = _JobRun(self, job)
        for number, prompt in enumerate(job.prompts):
            for index in range(number * job.request.n, (number + 1) * job.request.n):
                self._workers.submit(run.choice, prompt, index)
        return run.future

    def stop(self) -> None:
        """Refuse new jobs; the running ones end after their current token, the waiting ones never start."""
        with self._lock:
            self._stopping = True
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel()

    def close(self) -> None:
        """Stop, and wait for the workers and the batch to end."""
        self.stop()
        self._workers.shutdown(wait=True, cancel_futures=True)
        self.batch.close()
        self._stepper.join()

    # ---- on a worker thread ----------------------------------------------------------------------------
    def _run_choice(self, job: Job, prompt: PromptInput, index: int) -> Choice:
        with self._lock:
            self._jobs[job] = True
        if job.cancelled.is_set() or self._stopping:
            if job.on_text is not None:
                job.on_text(Piece(index, finish_reason="cancelled"))
            return Choice(index, "", "cancelled", None, Usage(0, 0))
        slot = self.slots.take(prompt if isinstance(prompt, str) and self.llm.config.reuse_kv else None)
        try:
            sampler = job.sampler if index == 0 else _choice_sampler(job.sampler, index)
            plan = job.request.reasoning
            counter = None if plan is None else plan.counter(self.llm.tokenizer)
            sampling = sampler if counter is None else BudgetSampler(sampler, counter, slot.cache.markup.stop_ids)
            clock = self.metrics.token_clock(sampling, job.arrived)
            clock.first_seen = index != 0   # the request's time to first token is its first choice's
            slot.view.sampler = clock
            run = ChoiceRun(slot.view, slot.cache, job.request, sampler, self.show_special,
                            lambda: job.cancelled.is_set() or self._stopping, job.on_text, reasoning=counter)
            with self.llm.media_sources(job.request.media):
                return run.run(prompt, index)
        except MnnGpuError as exc:
            code = "context_length_exceeded" if exc.field == "max_all_tokens" else None
            param = job.request.prompt_param if exc.field == "input_ids" else exc.field
            raise ApiError(400, str(exc), param=param, code=code) from None
        finally:
            self.slots.give(slot)

    def _done(self, job: Job, result: Result | None) -> None:
        with self._lock:
            self._jobs.pop(job, None)
        if result is not None:
            self.metrics.record_usage(result.usage)
        with self.stats.done:
            self.stats.finished += 1
            if result is not None:
                self.stats.cancelled += any(choice.finish_reason == "cancelled" for choice in result.choices)
                self.stats.completion_tokens += result.usage.completion_tokens
            self.stats.done.notify_all()


class _JobRun:
    """A job's choices as they finish on the workers; `future` gets the Result after the last, or
    the first error (the other choices are cancelled then)."""

    def __init__(self, served: ServedModel, job: Job):
        self.served, self.job = served, job
        self.future: Future = Future()
        self.choices: dict[int, Choice] = {}
        self.expected = len(job.prompts) * job.request.n
        self.lock = threading.Lock()

    def choice(self, prompt: PromptInput, index: int) -> None:
        try:
            choice = self.served._run_choice(self.job, prompt, index)
        except BaseException as exc:   # the request's future raises it on the event loop
            self.job.cancel()
            with self.lock:
                first = not self.future.done()
                if first:
                    self.future.set_exception(exc)
            if first:
                self.served._done(self.job, None)
            return
        with self.lock:
            self.choices[index] = choice
            if len(self.choices) < self.expected or self.future.done():
                return
            choices = [self.choices[i] for i in sorted(self.choices)]
            result = Result(choices, _total_usage(choices, self.job.request.n))
        self.served._done(self.job, result)
        self.future.set_result(result)


def _choice_sampler(sampler: RequestSampler, index: int) -> RequestSampler:
    """Choice `index`'s own copy of a request's sampler: its counts, grammar and random stream (from
    the seed plus `index` when the request is seeded, so the n choices differ and repeat)."""
    copy = deepcopy(sampler)
    seed = copy.sampler.settings.seed
    copy.sampler.reset(None if seed is None else seed + index)
    return copy


def _total_usage(choices: list[Choice], n: int) -> Usage:
    """Each prompt's tokens once (its first choice's), every choice's generated tokens."""
    firsts = [choice.usage for choice in choices if choice.index % n == 0]
    return Usage(sum(u.prompt_tokens for u in firsts), sum(c.usage.completion_tokens for c in choices),
                 sum(u.cached_tokens for u in firsts), sum(c.usage.reasoning_tokens for c in choices))
