"""Prometheus metrics, named after vLLM's under the prefix kvchat:.  Latencies are measured by the turn
flow as users see them; engine numbers (queues, KV, prefix cache, tokens) are read from the engine."""

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engine.protocol import EngineStats

PREFIX = "kvchat:"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
TOKEN_GAP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5)


class ServiceMetrics:
    def __init__(self, engine_stats: Callable[[], EngineStats]):
        self.registry = CollectorRegistry()
        self.time_to_first_token = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Time from receiving a turn to its first reply token.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.inter_token_latency = Histogram(
            PREFIX + "inter_token_latency_seconds",
            "Time between consecutive streamed pieces of a reply.",
            buckets=TOKEN_GAP_BUCKETS,
            registry=self.registry,
        )
        self.e2e_request_latency = Histogram(
            PREFIX + "e2e_request_latency_seconds",
            "Time from receiving a turn to its reply being stored as finished.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.request_success = Counter(
            PREFIX + "request_success",
            "Finished replies by finish reason (stop, length, abort, error).",
            ["finished_reason"],
            registry=self.registry,
        )
        self.registry.register(EngineStatsCollector(engine_stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class EngineStatsCollector(Collector):
    """Reads EngineClient.stats() at each scrape."""

    def __init__(self, engine_stats: Callable[[], EngineStats]):
        self.engine_stats = engine_stats

    def collect(self):
        stats = self.engine_stats()
        gauges = {
            "num_requests_running": ("Requests in the engine's running batch.", stats.num_running),
            "num_requests_waiting": ("Requests waiting in the engine's queue.", stats.num_waiting),
            "kv_cache_usage_perc": ("Fraction of KV cache blocks in use (0 to 1).", stats.kv_usage),
        }
        counters = {
            "prefix_cache_queries": (
                "Prompt tokens looked up in the prefix cache.",
                stats.prefix_cache_queries,
            ),
            "prefix_cache_hits": ("Prompt tokens found in the prefix cache.", stats.prefix_cache_hits),
            "prompt_tokens": ("Prompt tokens processed.", stats.prompt_tokens_total),
            "generation_tokens": ("Tokens generated.", stats.generation_tokens_total),
            "num_preemptions": ("Requests preempted to free KV cache.", stats.num_preemptions),
        }
        for name, (help_text, value) in gauges.items():
            yield GaugeMetricFamily(PREFIX + name, help_text, value=value)
        for name, (help_text, value) in counters.items():
            yield CounterMetricFamily(PREFIX + name, help_text, value=value)
