"""GET /metrics: the server's counters in Prometheus's text exposition format (prometheus_client),
the format Prometheus, and the routers that spread requests over servers, scrape.

    mnngpu_requests_total{endpoint, status}   HTTP responses, by route (its path template) and status
    mnngpu_prompt_tokens_total                 prompt tokens of the requests run (usage.prompt_tokens)
    mnngpu_prompt_cached_tokens_total          of those, the ones the KV cache already held
    mnngpu_generation_tokens_total             tokens generated (usage.completion_tokens)
    mnngpu_requests_waiting                    requests queued for a free slot
    mnngpu_requests_running                    requests being generated (up to --parallel at once)
    mnngpu_slots, mnngpu_slots_busy            the sequences generated at once (--parallel), and those busy now
    mnngpu_kv_cache_tokens                     tokens the KV cache holds
    mnngpu_kv_cache_capacity_tokens            tokens the backend's caches have room for now
    mnngpu_kv_cache_max_tokens                 max_all_tokens, the most a sequence may hold
    mnngpu_kv_cache_usage_ratio                tokens held / max_all_tokens
    mnngpu_kv_cache_bytes                      bytes of the backend's caches (keys, values, recurrent state)
    mnngpu_prefix_cache_queries_total          prompt tokens looked up in the prompt cache (--cache-ram)
    mnngpu_prefix_cache_hits_total             of those, the ones found there (vLLM's names and units)
    mnngpu_prefix_cache_blocks, _bytes         blocks the prompt cache holds, and their bytes
    mnngpu_time_to_first_token_seconds         histogram: a request's arrival to its first sampled token
    mnngpu_time_per_output_token_seconds       histogram: one sampled token to the next, within a choice

Each app has its own registry, so two servers in one process keep their counts apart. The
model's part (ModelMetrics) belongs to the ServedModel and joins the app's registry once the
model has loaded; until then /metrics shows the HTTP counts alone. A server of several models
(models.py) shows each loaded model's part with a `model` label (its id); a model's counts
start again from 0 when it loads again after an unload, as Prometheus's counters may.
`mnngpu_requests_total` counts the HTTP responses of every model together.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute, Match

# seconds; spread from a warm GPU's milliseconds to a long CPU prefill's minutes
FIRST_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
PER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0)
OTHER_ENDPOINT = "other"   # the label of a path no route matches (so unknown paths add no series)


class ModelMetrics:
    """The counts of one ServedModel: tokens, timings, and gauges read from it at each scrape."""

    def __init__(self, served):
        self.registry = CollectorRegistry()
        self.prompt_tokens = Counter("mnngpu_prompt_tokens", "Prompt tokens of the requests run",
                                     registry=self.registry)
        self.cached_tokens = Counter("mnngpu_prompt_cached_tokens", "Prompt tokens the KV cache already held",
                                     registry=self.registry)
        self.generation_tokens = Counter("mnngpu_generation_tokens", "Tokens generated", registry=self.registry)
        self.first_token = Histogram("mnngpu_time_to_first_token_seconds",
                                     "From a request's arrival to its first sampled token",
                                     buckets=FIRST_TOKEN_BUCKETS, registry=self.registry)
        self.per_token = Histogram("mnngpu_time_per_output_token_seconds",
                                   "From one sampled token to the next within a choice",
                                   buckets=PER_TOKEN_BUCKETS, registry=self.registry)
        self.registry.register(ServedGauges(served))

    def record_usage(self, usage) -> None:
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.cached_tokens.inc(usage.cached_tokens)
        self.generation_tokens.inc(usage.completion_tokens)

    def token_clock(self, sampler, arrived: float) -> TokenClock:
        return TokenClock(sampler, self, arrived)


class TokenClock:
    """The sampler the model samples with for one request: `sampler` itself, timed. The first token
    of the request gives the time to first token; every later token of a choice its time per token.
    next_choice() before each choice: its first token is timed from nothing before it."""

    def __init__(self, sampler, metrics: ModelMetrics, arrived: float):
        self.sampler, self.metrics, self.arrived = sampler, metrics, arrived
        self.first_seen = False
        self.last: float | None = None

    def next_choice(self) -> None:
        self.last = None

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        token = self.sampler.sample(logits, history)
        now = time.perf_counter()
        if not self.first_seen:
            self.first_seen = True
            self.metrics.first_token.observe(now - self.arrived)
        elif self.last is not None:
            self.metrics.per_token.observe(now - self.last)
        self.last = now
        return token


class ServedGauges(Collector):
    """The queue, the running requests, the slots and the KV caches of a ServedModel, read when scraped."""

    def __init__(self, served):
        self.served = served

    def collect(self) -> Iterator[Metric]:
        served = self.served
        yield _gauge("mnngpu_requests_waiting", "Requests queued for a slot", served.waiting)
        yield _gauge("mnngpu_requests_running", "Requests being generated", served.running)
        yield _gauge("mnngpu_slots", "Sequences the server generates at once (--parallel)", served.parallel)
        yield _gauge("mnngpu_slots_busy", "Slots a request holds now", served.slots.busy)
        limit = served.llm.config.max_all_tokens
        held, room = served.kv_tokens(), limit * served.parallel
        yield _gauge("mnngpu_kv_cache_tokens", "Tokens the slots' KV caches hold", held)
        yield _gauge("mnngpu_kv_cache_capacity_tokens", "Tokens the slots' KV caches have room for now",
                     served.kv_capacity())
        yield _gauge("mnngpu_kv_cache_max_tokens", "max_all_tokens times the slots: the most tokens the KV caches "
                     "may hold", room)
        yield _gauge("mnngpu_kv_cache_usage_ratio", "Tokens held / the most they may hold", held / room)
        yield _gauge("mnngpu_kv_cache_bytes", "Bytes of the slots' KV caches and recurrent states (backend and "
                     "CPU backup)", served.batch.cache_bytes())
        blocks = served.slots.prompt_blocks
        if blocks is not None:
            cache = blocks.cache
            yield CounterMetricFamily("mnngpu_prefix_cache_queries", "Prompt tokens looked up in the prompt cache",
                                      value=cache.counts.queries)
            yield CounterMetricFamily("mnngpu_prefix_cache_hits", "Prompt tokens the prompt cache held",
                                      value=cache.counts.hits)
            yield _gauge("mnngpu_prefix_cache_blocks", "KV blocks the prompt cache holds", len(cache))
            yield _gauge("mnngpu_prefix_cache_bytes", "Bytes the prompt cache holds (host memory)", cache.nbytes)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


class ServerMetrics:
    """The app's registry: the HTTP responses, and the served model's counts once it has loaded."""

    def __init__(self, routes: list[BaseRoute], models):
        self.routes = routes
        self.registry = CollectorRegistry()
        self.requests = Counter("mnngpu_requests", "HTTP responses by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        self.registry.register(_LoadedModels(models))

    def count_response(self, scope: dict, status: int) -> None:
        self.requests.labels(endpoint=self.endpoint(scope), status=str(status)).inc()

    def endpoint(self, scope: dict) -> str:
        """The path template of the route the request went to (a wrong method still names it)."""
        for route in self.routes:
            match, _ = route.matches(scope)
            if match != Match.NONE:
                return route.path
        return OTHER_ENDPOINT

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _LoadedModels(Collector):
    """The loaded models' registries: one model's as it is, several models' merged, a sample per
    model, each labelled with its model's id."""

    def __init__(self, models):
        self.models = models

    def collect(self) -> Iterator[Metric]:
        loaded = self.models.loaded()
        if not self.models.several:
            for served in loaded:
                yield from served.metrics.registry.collect()
            return
        merged: dict[str, Metric] = {}
        for served in loaded:
            for family in served.metrics.registry.collect():
                into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                into.samples += [sample._replace(labels={**sample.labels, "model": served.name})
                                 for sample in family.samples]
        yield from merged.values()
