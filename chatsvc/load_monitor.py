"""The engine panel's figures over a recent window: rates from the engine's counters between polls, and
time-to-first-token percentiles as the turn flow measured them."""

import math
import time
from collections import deque

from chatsvc.views import EnginePanel
from engine.protocol import EngineStats

WINDOW_S = 300.0


class LoadMonitor:
    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self.ttfts: deque[tuple[float, float]] = deque(maxlen=10_000)  # (when, seconds)
        self.samples: deque[tuple[float, EngineStats]] = deque()

    def record_ttft(self, seconds: float) -> None:
        self.ttfts.append((time.monotonic(), seconds))

    def panel(
        self, state: str, stats: EngineStats, session_memory: dict[str, int] | None, note: str | None
    ) -> EnginePanel:
        now = time.monotonic()
        self.samples.append((now, stats))
        while len(self.samples) > 1 and self.samples[0][0] < now - self.window_s:
            self.samples.popleft()
        since, first = self.samples[0]
        elapsed = now - since

        def rate(name: str) -> float | None:
            return (getattr(stats, name) - getattr(first, name)) / elapsed if elapsed > 0 else None

        recent = sorted(seconds for at, seconds in self.ttfts if at >= now - self.window_s)
        return EnginePanel(
            state=state,
            running=stats.num_running,
            waiting=stats.num_waiting,
            kv_usage=stats.kv_usage,
            kv_blocks_used=stats.kv_blocks_used,
            kv_blocks_total=stats.kv_blocks_total,
            prefix_cache_hit_rate=_hit_rate(first, stats),
            generation_tokens_per_s=rate("generation_tokens_total"),
            prompt_tokens_per_s=rate("prompt_tokens_total"),
            ttft_p50_s=_percentile(recent, 0.50),
            ttft_p99_s=_percentile(recent, 0.99),
            window_s=self.window_s,
            session_memory=session_memory,
            weights=weights_line(stats),
            kv_pool=kv_pool_line(stats),
            speculative=speculative_line(stats),
            note=note,
        )


def weights_line(stats: EngineStats) -> str:
    """`bfloat16, int8 weights, 89 MB`: what the model computes in and reads per token."""
    quantized = f", {stats.quantization} weights" if stats.quantization != "none" else ""
    return f"{stats.dtype}{quantized}, {stats.weight_bytes / 1e6:.0f} MB" if stats.dtype else ""


def kv_pool_line(stats: EngineStats) -> str:
    """`bfloat16, 2147 MB, 47,000 tokens`."""
    if not stats.kv_cache_dtype:
        return ""
    return f"{stats.kv_cache_dtype}, {stats.kv_pool_bytes / 1e6:.0f} MB, {stats.kv_pool_tokens:,} tokens"


def speculative_line(stats: EngineStats) -> str:
    """`ngram: 812 of 1,204 draft tokens accepted (67 %), 2.1 tokens a step`: since the engine started."""
    if stats.speculative == "none":
        return ""
    if not stats.spec_num_drafts:
        return f"{stats.speculative}: no drafts yet"
    share = stats.spec_accepted_tokens / stats.spec_draft_tokens
    per_step = 1 + stats.spec_accepted_tokens / stats.spec_num_drafts
    return (
        f"{stats.speculative}: {stats.spec_accepted_tokens:,} of {stats.spec_draft_tokens:,} draft tokens "
        f"accepted ({share:.0%}), {per_step:.1f} tokens a drafted step"
    )


def _hit_rate(first: EngineStats, last: EngineStats) -> float | None:
    queries = last.prefix_cache_queries - first.prefix_cache_queries
    if queries > 0:
        return (last.prefix_cache_hits - first.prefix_cache_hits) / queries
    return last.prefix_cache_hits / last.prefix_cache_queries if last.prefix_cache_queries else None


def _percentile(ordered: list[float], q: float) -> float | None:
    """Nearest rank, as a latency percentile over few samples should be (a real observed value)."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
