"""The server's Prometheus metrics, named after vLLM's (``vllm:`` -> ``aotforge:``) so dashboards carry over.

Each app has a registry of its own (two servers in one process never share counters); an engine listener feeds
the engine's per-step statistics in, an ASGI wrapper counts HTTP responses by status code.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from aotforge.runtime.outputs import FinishReason, StepStats

# vLLM's buckets (vllm/v1/metrics/loggers.py), in seconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)


class ServerMetrics:
    """The metrics of one served model; :meth:`observe` is the engine listener."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, labels = self.registry, ["model_name"]

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(model_name)

        self.running = gauge("aotforge:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("aotforge:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("aotforge:kv_cache_usage_perc", "Fraction of KV-cache blocks held (1 = all).")
        self.kv_blocks = gauge("aotforge:kv_cache_blocks_used", "KV-cache blocks held by sequences.")
        self.preemptions = counter("aotforge:num_preemptions_total", "Preemptions (recompute) of running requests.")
        self.prompt_tokens = counter("aotforge:prompt_tokens_total", "Prompt tokens prefilled.")
        self.generation_tokens = counter("aotforge:generation_tokens_total", "Tokens generated.")
        self.prefix_queries = counter("aotforge:prefix_cache_queries_total", "Prompt tokens looked up in the cache.")
        self.prefix_hits = counter("aotforge:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.")
        self._success = Counter(
            "aotforge:request_success_total",
            "Finished requests by finish reason.",
            ["model_name", "finished_reason"],
            registry=r,
        )
        for reason in FinishReason:  # every series present from the start, at 0
            self._success.labels(model_name, reason.value)
        self._model_name = model_name
        self.ttft = histogram("aotforge:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = histogram("aotforge:inter_token_latency_seconds", "Time between two tokens.", ITL_BUCKETS)
        self.e2e = histogram("aotforge:e2e_request_latency_seconds", "Arrival to last token.", REQUEST_BUCKETS)
        self.queue = histogram("aotforge:request_queue_time_seconds", "Time waiting to be scheduled.", REQUEST_BUCKETS)
        self._last: StepStats | None = None
        self.http = Counter(
            "aotforge:http_requests_total", "HTTP responses by route and status code.", ["path", "status"], registry=r
        )

    def observe(self, stats: StepStats) -> None:
        """One engine step's statistics (called on the engine's thread; prometheus_client is thread-safe).

        The same object twice is one step, counted once: the engine hands its listeners its latest statistics
        also after a turn that ran no step (an abort of a request that had already finished)."""
        if stats is self._last:
            return
        self._last = stats
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        self.kv_blocks.set(stats.kv_blocks_used)
        self.preemptions.inc(stats.num_preemptions)
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generation_tokens.inc(stats.generation_tokens)
        self.prefix_queries.inc(stats.prefix_cache_queries)
        self.prefix_hits.inc(stats.prefix_cache_hits)
        for s in stats.time_to_first_tokens_s:
            self.ttft.observe(s)
        for s in stats.inter_token_latencies_s:
            self.itl.observe(s)
        for f in stats.finished:
            self._success.labels(self._model_name, FinishReason(f.finish_reason).value).inc()
            self.e2e.observe(f.e2e_latency_s)
            self.queue.observe(f.queue_time_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class CountResponses:
    """ASGI middleware: every HTTP response counted by its route (``unmatched`` for a path no route has: a scan
    of made-up paths must not grow the label set) and status code; a stream counts once, at its start."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                path = getattr(scope.get("route"), "path", "unmatched")
                self.metrics.http.labels(path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
