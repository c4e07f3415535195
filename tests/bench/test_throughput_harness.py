"""The throughput harness times only serving: an engine's start-up (its first call builds it) lands before
the clock in every scenario, and a ratio is the median of the per-round ratios."""

import asyncio
import time

import pytest

from bench.throughput import load_figures, offline_figures, ratios, streamed_figures
from bench.workloads import Request

TOKENS_PER_S = 2000


class SlowStart:
    """An engine that takes `start_s` to build on its first call, then serves TOKENS_PER_S tokens a second."""

    def __init__(self, start_s: float):
        self.start_s = start_s
        self.built = False

    def offline(self, requests: list[Request]) -> int:
        if not self.built:
            time.sleep(self.start_s)
            self.built = True
        tokens = sum(request.max_tokens for request in requests)
        time.sleep(tokens / TOKENS_PER_S)
        return tokens

    async def stream(self, request: Request) -> tuple[float, int]:
        if not self.built:
            self.built = True
            await asyncio.sleep(self.start_s)
        first = time.perf_counter()
        await asyncio.sleep(request.max_tokens / TOKENS_PER_S)
        return first, request.max_tokens


def requests(count: int, new_tokens: int, every_s: float = 0.0) -> list[Request]:
    return [Request([1, 2, 3], new_tokens, arrival=i * every_s) for i in range(count)]


def test_a_slow_start_changes_no_offline_figure():
    warm_up, timed = requests(2, 4), requests(8, 100)
    quick = offline_figures(SlowStart(0.0), warm_up, timed)["tokens_per_s"]
    slow = offline_figures(SlowStart(1.0), warm_up, timed)["tokens_per_s"]
    assert slow == pytest.approx(quick, rel=0.1)
    assert quick == pytest.approx(TOKENS_PER_S, rel=0.2)


def test_a_slow_start_changes_no_streamed_figure():
    warm_up, timed = requests(2, 4), requests(4, 200, every_s=0.05)
    quick = asyncio.run(streamed_figures(SlowStart(0.0), warm_up, timed, load_figures))
    slow = asyncio.run(streamed_figures(SlowStart(1.0), warm_up, timed, load_figures))
    assert slow["ttft_p99_s"] < 0.05  # the start-up second is in neither the first token nor the rate
    assert slow["tokens_per_s"] == pytest.approx(quick["tokens_per_s"], rel=0.1)


def test_a_ratio_is_the_median_of_the_per_round_ratios():
    rounds = {
        "ours": {
            "offline": [{"tokens_per_s": 10, "ttft_p99_s": 1.0}, {"tokens_per_s": 20, "ttft_p99_s": 2.0}]
        },
        "vllm": {
            "offline": [{"tokens_per_s": 10, "ttft_p99_s": 3.0}, {"tokens_per_s": 40, "ttft_p99_s": 2.0}]
        },
    }
    rounds["ours"]["offline"].append({"tokens_per_s": 30, "ttft_p99_s": 1.0})
    rounds["vllm"]["offline"].append({"tokens_per_s": 10, "ttft_p99_s": 4.0})
    found = ratios(rounds, "ours")["vllm"]["offline"]
    assert found["tokens_per_s"]["rounds"] == [1.0, 0.5, 3.0]
    assert found["tokens_per_s"]["median"] == 1.0  # not 20 / 10, the ratio of the medians
    assert found["ttft_p99_s"]["rounds"] == [3.0, 1.0, 4.0]  # times: theirs over ours


def test_ratios_are_of_the_first_engine_named():
    rounds = {
        "ours_int8": {"batch1": [{"decode_tokens_per_s": 30.0}]},
        "ours": {"batch1": [{"decode_tokens_per_s": 20.0}]},
    }
    assert ratios(rounds, "ours_int8")["ours"]["batch1"]["decode_tokens_per_s"]["median"] == 1.5
    assert "ours_int8" not in ratios(rounds, "ours_int8")
