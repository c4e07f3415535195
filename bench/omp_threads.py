"""Does torch work on another thread slow the engine's streamed decode?  (See engine/threads.py.)

    .venv/bin/python -m bench.omp_threads

One process, one engine; batch-1 streamed decode (best of 3 streams of 96 tokens) measured first alone,
then after another thread ran one parallel matrix product in each of three ways: on a passing thread
(run_in_passing_thread), on a live thread with one intra-op thread (single_threaded_torch), and on a live
thread with torch's defaults, last, since its effect lasts as long as that thread does.
Results: bench/results/omp_threads.json.
"""

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.default_model import default_model_dir
from engine.sampling_params import SamplingParams
from engine.threads import DEFAULT_THREADS, run_in_passing_thread, single_threaded_torch

RESULTS = Path(__file__).resolve().parent / "results" / "omp_threads.json"
TOKENS = 96


def matrix_product() -> float:
    a = torch.randn(1500, 1500)
    return float((a @ a).sum())


async def decode_speed(engine: AsyncEngine, prompt_ids: list[int]) -> float:
    best = 0.0
    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    for _ in range(3):
        first = None
        async for _delta in engine.generate({"prompt_token_ids": prompt_ids}, params, str(time.time())):
            first = first or time.perf_counter()
        best = max(best, (TOKENS - 1) / (time.perf_counter() - first))
    return best


async def measure(engine: AsyncEngine) -> dict:
    prompt_ids = engine.tokenizer.encode("Tell me a long story about a dragon who learns to cook.")
    results = {"alone": await decode_speed(engine, prompt_ids)}
    run_in_passing_thread(matrix_product)
    results["after_a_passing_thread"] = await decode_speed(engine, prompt_ids)
    single = ThreadPoolExecutor(1, initializer=single_threaded_torch)
    single.submit(matrix_product).result()
    results["beside_a_live_single_threaded_thread"] = await decode_speed(engine, prompt_ids)
    default = ThreadPoolExecutor(1)
    default.submit(matrix_product).result()
    results["beside_a_live_default_thread"] = await decode_speed(engine, prompt_ids)
    return results


def main() -> None:
    engine = AsyncEngine(EngineConfig(model=str(default_model_dir()), dtype="float32"))
    try:
        results = {"decode_tokens_per_s": asyncio.run(measure(engine)), "threads": DEFAULT_THREADS}
    finally:
        engine.shutdown()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
