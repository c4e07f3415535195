"""What the int8 KV cache buys session memory, per KV dtype side by side in one run: KV bytes per token,
how many 2,000-token chat sessions a 1 GiB pool holds, and how long a 4,000-token session takes to come
back from disk (and, for scale, to recompute).

    .venv/bin/python -m bench.kv_memory [--model DIR] [--rounds 5]

Sessions held: distinct 2,000-token prompts, each a session of its own, are sent one after another into
an engine with a 1 GiB pool until it has turned sessions away; the count is what the pool holds at the
end.  Resume: a 4,000-token session is written to disk by session memory and dropped from the pool, then
brought back (read, checked, written into the pool); every engine is built and warmed up first, and the
rounds go through the variants in turn.  Results: bench/results/<machine kind>/kv_memory.json, and the
plot docs/kv_memory_<machine kind>.png (`--plot-only` redraws it from the results file).
"""

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.machine import describe, kind, results_path, write_results
from engine.async_engine import AsyncEngine
from engine.config import EngineConfig, cpu_flags
from engine.sampling_params import SamplingParams
from memory.session_memory.config import MemoryConfig
from memory.session_memory.session_memory import SessionMemory

ROOT = Path(__file__).resolve().parent
VARIANTS = {  # name -> engine options
    "bfloat16": {"dtype": "bfloat16"},
    "bfloat16 + int8 KV": {"dtype": "bfloat16", "kv_cache_dtype": "int8"},
    "float32": {"dtype": "float32"},
    "float32 + int8 KV": {"dtype": "float32", "kv_cache_dtype": "int8"},
}
SESSION_TOKENS, RESUME_TOKENS, POOL_GB = 2000, 4000, 1.0
ONE_TOKEN = SamplingParams(temperature=0, max_tokens=1)


def random_prompt(rng: random.Random, length: int) -> dict:
    return {"prompt_token_ids": [rng.randrange(1000, 40000) for _ in range(length)]}


async def turn(memory: SessionMemory, session_id: str, prompt: dict) -> None:
    async for _ in memory.generate(prompt, ONE_TOKEN, f"{session_id}-{time.monotonic_ns()}", session_id):
        pass


async def sessions_held(memory: SessionMemory, seed: int) -> int:
    """Sessions of SESSION_TOKENS sent until the pool has moved some out; how many it holds then."""
    rng = random.Random(seed)
    tokens = memory.stats().kv_pool_tokens
    for index in range(tokens // SESSION_TOKENS + 3):
        await turn(memory, f"fill{index}", random_prompt(rng, SESSION_TOKENS))
    return await memory.engine.call(lambda: len(memory.cache.sessions))


async def resume_seconds(memory: SessionMemory) -> float:
    await memory.evict("long")
    start = time.perf_counter()
    assert await memory.resume("long")
    return time.perf_counter() - start


async def recompute_seconds(memory: SessionMemory, prompt: dict) -> float:
    await memory.drop("recompute")
    start = time.perf_counter()
    await turn(memory, "recompute", prompt)
    return time.perf_counter() - start


def build(model: str, options: dict, data_dir: Path) -> SessionMemory:
    # No prefix caching: the recompute figure would otherwise read the resumed session's blocks.
    config = EngineConfig(model, kv_cache_memory_gb=POOL_GB, enable_prefix_caching=False, **options)
    engine = AsyncEngine(config)
    # No budget below the pool's own size: what is measured is what the pool holds.
    unlimited = 2**30
    budgets = MemoryConfig(data_dir, session_budget_tokens=unlimited, global_budget_tokens=unlimited)
    return SessionMemory(engine, budgets)


async def measure(model: str, rounds: int, data_dir: Path) -> dict:
    memories = {
        name: build(model, options, data_dir / str(i)) for i, (name, options) in enumerate(VARIANTS.items())
    }
    long_prompt = random_prompt(random.Random(1), RESUME_TOKENS)
    results = {}
    for name, memory in memories.items():  # warm-up, and the session that will be resumed
        await turn(memory, "long", long_prompt)
        stats = memory.stats()
        results[name] = {
            "weight_bytes": stats.weight_bytes,
            "kv_bytes_per_token": stats.kv_pool_bytes / stats.kv_pool_tokens,
            "pool_tokens": stats.kv_pool_tokens,
            "session_file_bytes": await memory.evict("long"),
            "resume_s": [],
            "recompute_s": [],
        }
        await memory.resume("long")
    for _ in range(rounds):
        for name, memory in memories.items():
            results[name]["resume_s"].append(round(await resume_seconds(memory), 4))
            results[name]["recompute_s"].append(round(await recompute_seconds(memory, long_prompt), 3))
    for name, memory in memories.items():
        results[name]["sessions_held_at_2000_tokens"] = await sessions_held(memory, seed=2)
        memory.shutdown()
        for key in "resume_s", "recompute_s":
            results[name][key + "_median"] = statistics.median(results[name][key])
    return results


def plot(output: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(output["variants"])
    variants = output["variants"].values()
    panels = [
        (
            f"{output['session_tokens']:,}-token sessions in a {output['pool_gib']:g} GiB pool",
            "sessions_held_at_2000_tokens",
        ),
        (f"resume a {output['resume_tokens']:,}-token session from disk (s)", "resume_s_median"),
    ]
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for axis, (title, key) in zip(axes, panels, strict=True):
        axis.bar(range(len(names)), [variant[key] for variant in variants], color="tab:blue")
        axis.set_xticks(range(len(names)), [name.replace(" + ", "\n+ ") for name in names], fontsize=7)
        axis.set_title(title, fontsize=9)
    machine = output["machine"]
    figure.suptitle(f"{output['model']}, {machine['cpu']}, {machine['cores']} cores", fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    machine_kind = kind(cpu_flags())
    path = results_path(machine_kind, "kv_memory")
    figure = ROOT.parent / "docs" / f"kv_memory_{machine_kind}.png"
    if args.plot_only:
        plot(json.loads(path.read_text()), figure)
        return
    from engine.default_model import default_model_dir

    model = args.model or str(default_model_dir())
    with tempfile.TemporaryDirectory() as data_dir:
        results = asyncio.run(measure(model, args.rounds, Path(data_dir)))
    machine = describe(None)
    output = {
        "machine": machine,
        "model": Path(model).name,
        "pool_gib": POOL_GB,
        "session_tokens": SESSION_TOKENS,
        "resume_tokens": RESUME_TOKENS,
        "variants": results,
    }
    write_results("kv_memory", output)
    plot(output, figure)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
