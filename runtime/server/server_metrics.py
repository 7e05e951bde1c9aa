"""Prometheus metrics of the HTTP server (prometheus_client, one private registry per server):
request counters, TTFT/ITL/E2E histograms as clients see them, and the scheduler's gauges. With several
tokenizer workers, prometheus_client's multiprocess mode sums them (PROMETHEUS_MULTIPROC_DIR must be set
before prometheus_client is first imported in the process)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from runtime.server.ipc import Finish, SchedulerStats

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                     0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)


class ServerMetrics:
    def __init__(self, model_name: str, multiprocess: bool = False) -> None:
        """`multiprocess`: `exposition` reports every worker's (counters and histograms summed, gauges
        the most recent value any worker set)."""
        self.multiprocess = multiprocess
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        r = self.registry
        self.requests = Counter("twinserve_requests", "HTTP generation requests received", ["endpoint"], registry=r)
        self.errors = Counter("twinserve_request_errors", "Requests refused with an error", ["status"], registry=r)
        self.finished = Counter("twinserve_requests_finished", "Requests ended, by finish reason", ["reason"],
                                registry=r)
        self.prompt_tokens = Counter("twinserve_prompt_tokens", "Prompt tokens of ended requests", registry=r)
        self.generation_tokens = Counter("twinserve_generation_tokens", "Generated tokens", registry=r)
        self.cached_tokens = Counter("twinserve_cached_tokens", "Prompt tokens served from the radix cache",
                                     registry=r)
        hist = lambda name, doc: Histogram(name, doc, buckets=LATENCY_BUCKETS_S, registry=r)   # noqa: E731
        self.ttft = hist("twinserve_time_to_first_token_seconds", "Arrival to first token delivered")
        self.itl = hist("twinserve_inter_token_latency_seconds", "Gap between consecutive delivered tokens")
        self.e2e = hist("twinserve_e2e_request_latency_seconds", "Arrival to last token delivered")
        gauge = lambda name, doc: Gauge(name, doc, list(labels), registry=r,   # noqa: E731
                                        multiprocess_mode="mostrecent").labels(**labels)
        self.num_running = gauge("twinserve_num_running_reqs", "Requests in the running batch")
        self.num_waiting = gauge("twinserve_num_waiting_reqs", "Requests waiting for admission")
        self.kv_used = gauge("twinserve_kv_used_tokens", "KV slots in use (requests and radix cache)")
        self.kv_usage = gauge("twinserve_kv_usage", "Share of the KV pool in use")
        self.cache_hit_rate = gauge("twinserve_cache_hit_rate", "Cached / prompt tokens of admitted requests")

    def on_tokens(self, arrival_s: float, prev_token_s: float | None, now_s: float, num_tokens: int) -> None:
        """One request's tokens delivered at `now_s` (clock seconds): the first gap is TTFT or ITL, the
        rest are 0. The generated-token counter is counted per batch (`on_batch`)."""
        if num_tokens <= 0:
            return
        if prev_token_s is None:
            self.ttft.observe(now_s - arrival_s)
        else:
            self.itl.observe(now_s - prev_token_s)
        for _ in range(num_tokens - 1):
            self.itl.observe(0.0)

    def on_batch(self, num_tokens: int) -> None:
        if num_tokens:
            self.generation_tokens.inc(num_tokens)

    def on_finish(self, finish: Finish, arrival_s: float, now_s: float) -> None:
        self.finished.labels(reason=finish.reason).inc()
        self.prompt_tokens.inc(finish.prompt_tokens)
        self.cached_tokens.inc(finish.cached_tokens)
        if finish.reason in ("stop", "length"):
            self.e2e.observe(now_s - arrival_s)

    def on_stats(self, stats: SchedulerStats) -> None:
        self.num_running.set(stats.num_running)
        self.num_waiting.set(stats.num_waiting)
        self.kv_used.set(stats.kv_used_tokens)
        self.kv_usage.set(stats.kv_used_tokens / max(stats.kv_capacity_tokens, 1))
        if stats.prompt_tokens_total:
            self.cache_hit_rate.set(stats.cached_tokens_total / stats.prompt_tokens_total)

    def exposition(self) -> bytes:
        if not self.multiprocess:
            return generate_latest(self.registry)
        every_worker = CollectorRegistry()
        MultiProcessCollector(every_worker)
        return generate_latest(every_worker)
