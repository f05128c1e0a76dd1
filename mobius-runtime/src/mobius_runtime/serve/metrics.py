"""``GET /metrics``: the server's counters in Prometheus' text format (prometheus-client).

Each app has its own registry (two servers in one process do not share counts):

- ``mobius_requests_total{endpoint, status}``: answered HTTP requests by path and status
  (the status a response started with; a stream's error chunk keeps its 200);
- ``mobius_prompt_tokens_total`` / ``mobius_generation_tokens_total``: tokens in and out
  of finished generations (a prompt of ``n`` choices counts once);
- ``mobius_time_to_first_token_seconds`` and ``mobius_inter_token_latency_seconds``
  (histograms; one observation per finished request: its mean gap between tokens);
- ``mobius_finished_total{reason}``: finished rows by the runtime's finish reason;
- ``mobius_queue_depth``, ``mobius_batch_size`` (rows in the current decode step) and
  ``mobius_batch_size_peak``: read from the engine when scraped;
- with a prefix cache: ``mobius_prefix_cache_hits_total``, ``..._misses_total`` and
  ``..._tokens_total`` (prompt ids served from kept KV rows).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/tokenize",
    "/detokenize",
    "/health",
    "/metrics",
)  # other paths count as "other": the label's values stay bounded
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class _Finished:
    """A collector of the engine's own counters, read live: finished rows by reason and
    the prefix cache's hits."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self) -> Iterable[CounterMetricFamily]:
        family = CounterMetricFamily(
            "mobius_finished", "Finished generations by finish reason", labels=["reason"]
        )
        for reason, count in sorted(self.engine.finished.items()):
            family.add_metric([str(reason)], count)
        yield family
        cache = self.engine.cache
        if cache is not None:
            for name, text, value in (
                ("mobius_prefix_cache_hits", "Prompts that reused kept KV rows", cache.hits),
                ("mobius_prefix_cache_misses", "Text prompts with no kept prefix", cache.misses),
                (
                    "mobius_prefix_cache_tokens",
                    "Prompt ids served from kept rows",
                    cache.cached_tokens,
                ),
            ):
                yield CounterMetricFamily(name, text, value=value)


class Metrics:
    """The registry of one app and the calls that update it."""

    def __init__(self, engine: Any) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "mobius_requests", "HTTP requests answered", ["endpoint", "status"], registry=registry
        )
        self.prompt_tokens = Counter(
            "mobius_prompt_tokens", "Prompt tokens of finished generations", registry=registry
        )
        self.generation_tokens = Counter(
            "mobius_generation_tokens", "Tokens generated", registry=registry
        )
        self.ttft = Histogram(
            "mobius_time_to_first_token_seconds",
            "Time from a request's arrival in the engine to its first token",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.itl = Histogram(
            "mobius_inter_token_latency_seconds",
            "A finished request's mean time between two generated tokens",
            buckets=ITL_BUCKETS,
            registry=registry,
        )
        depth = Gauge("mobius_queue_depth", "Requests waiting for a batch slot", registry=registry)
        depth.set_function(lambda: engine.queued)
        size = Gauge("mobius_batch_size", "Rows of the current decode step", registry=registry)
        size.set_function(lambda: engine.active)
        peak = Gauge("mobius_batch_size_peak", "The most rows one step served", registry=registry)
        peak.set_function(lambda: engine.peak_batch)
        registry.register(_Finished(engine))

    def answered(self, path: str, status: int) -> None:
        endpoint = path if path in ENDPOINTS else "other"
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def finished(self, done: list[Any]) -> None:
        """Count the finished choices of one request (``engine.Finished``)."""
        self.prompt_tokens.inc(done[0].prompt_tokens)
        for finished in done:
            self.generation_tokens.inc(finished.completion_tokens)
            self.ttft.observe(finished.ttft_ms / 1000.0)
            if finished.tokens_per_s > 0:
                self.itl.observe(1.0 / finished.tokens_per_s)

    def text(self) -> bytes:
        return generate_latest(self.registry)


class Counted:
    """ASGI middleware: count each HTTP response by path and status in ``metrics``."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.metrics.answered(scope.get("path", ""), int(message["status"]))
            await send(message)

        await self.app(scope, receive, counted)
