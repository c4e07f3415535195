"""Prometheus metrics, named after vLLM's under the prefix kvchat:.  Latencies are measured by the turn
flow as users see them; engine numbers (queues, KV, prefix cache, tokens) are read from the engine, and
session KV numbers from the session memory, where the engine has one."""

import logging
from collections.abc import Callable
from typing import ClassVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from engine.protocol import EngineStats

PREFIX = "kvchat:"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
TOKEN_GAP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5)
RETRIEVAL_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5)
log = logging.getLogger(__name__)


class ServiceMetrics:
    def __init__(
        self, engine_stats: Callable[[], EngineStats], session_stats: Callable[[], dict[str, int] | None]
    ):
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
        self.retrieval_latency = Histogram(
            PREFIX + "retrieval_latency_seconds",
            "Time to retrieve a turn's sources, by the intent the retriever chose.",
            ["intent"],
            buckets=RETRIEVAL_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(EngineStatsCollector(engine_stats))
        self.registry.register(SessionMemoryCollector(session_stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class EngineStatsCollector(Collector):
    """Reads EngineClient.stats() at each scrape."""

    def __init__(self, engine_stats: Callable[[], EngineStats]):
        self.engine_stats = engine_stats

    def collect(self):
        stats = self.engine_stats()
        info = InfoMetricFamily(
            PREFIX + "engine", "How the engine computes: dtypes, weight quantization, speculative decoding."
        )
        info.add_metric(
            [],
            {
                "dtype": stats.dtype,
                "quantization": stats.quantization,
                "kv_cache_dtype": stats.kv_cache_dtype,
                "speculative": stats.speculative,
            },
        )
        yield info
        for name, (help_text, value) in engine_gauges(stats).items():
            yield GaugeMetricFamily(PREFIX + name, help_text, value=value)
        for name, (help_text, value) in engine_counters(stats).items():
            yield CounterMetricFamily(PREFIX + name, help_text, value=value)


def engine_gauges(stats: EngineStats) -> dict[str, tuple[str, float]]:
    return {
        "num_requests_running": ("Requests in the engine's running batch.", stats.num_running),
        "num_requests_waiting": ("Requests waiting in the engine's queue.", stats.num_waiting),
        "kv_cache_usage_perc": ("Fraction of KV cache blocks in use (0 to 1).", stats.kv_usage),
        "weight_bytes": ("Bytes of the model's weights as the engine holds them.", stats.weight_bytes),
        "kv_pool_bytes": ("Bytes of the KV block pool.", stats.kv_pool_bytes),
        "kv_pool_tokens": ("Tokens the KV block pool holds.", stats.kv_pool_tokens),
    }


def engine_counters(stats: EngineStats) -> dict[str, tuple[str, float]]:
    return {
        "prefix_cache_queries": ("Prompt tokens looked up in the prefix cache.", stats.prefix_cache_queries),
        "prefix_cache_hits": ("Prompt tokens found in the prefix cache.", stats.prefix_cache_hits),
        "prompt_tokens": ("Prompt tokens processed.", stats.prompt_tokens_total),
        "prefill_tokens": (
            "Prompt tokens computed (not served from the prefix cache or a session's KV).",
            stats.prefill_tokens_total,
        ),
        "generation_tokens": ("Tokens generated.", stats.generation_tokens_total),
        "num_preemptions": ("Requests preempted to free KV cache.", stats.num_preemptions),
        "spec_decode_num_drafts": ("Speculative drafts checked.", stats.spec_num_drafts),
        "spec_decode_num_draft_tokens": ("Tokens in speculative drafts.", stats.spec_draft_tokens),
        "spec_decode_num_accepted_tokens": ("Speculative draft tokens accepted.", stats.spec_accepted_tokens),
    }


class SessionMemoryCollector(Collector):
    """Reads the session memory's counters at each scrape; nothing while the engine loads or has none."""

    GAUGES: ClassVar[dict[str, tuple[str, str]]] = {
        "sessions_in_pool": ("session_kv_sessions", "Sessions whose KV is held in the pool."),
        "session_blocks": ("session_kv_blocks", "KV blocks held by sessions between their turns."),
    }
    COUNTERS: ClassVar[dict[str, tuple[str, str]]] = {
        "evictions": ("session_kv_evictions", "Times a session's KV was compressed to its budget."),
        "offloads": ("session_kv_offloads", "Idle sessions moved out of the pool to disk for room."),
        "restores": ("session_kv_restores", "Sessions' KV read back into the pool from memory or disk."),
        "restore_failures": (
            "session_kv_restore_failures",
            "Saved KV files not used (missing, damaged or mismatched): the turn recomputed.",
        ),
        "reused_tokens": ("session_kv_reused_tokens", "Prompt tokens served from sessions' KV."),
    }

    def __init__(self, session_stats: Callable[[], dict[str, int] | None]):
        self.session_stats = session_stats

    def collect(self):
        try:
            stats = self.session_stats()
        except Exception:  # the engine stopped between the check and the read: a scrape without them
            log.warning("session memory counters unavailable", exc_info=True)
            return
        if stats is None:
            return
        for key, (name, help_text) in self.GAUGES.items():
            yield GaugeMetricFamily(PREFIX + name, help_text, value=stats[key])
        for key, (name, help_text) in self.COUNTERS.items():
            yield CounterMetricFamily(PREFIX + name, help_text, value=stats[key])
