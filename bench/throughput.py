"""Throughput and latency of our engine beside transformers' generate and vLLM's CPU build.

    .venv/bin/python -m bench.throughput [--engines ours vllm transformers] [--dtypes float32 bfloat16]
        [--scenarios offline short_chats online batch1 mixed_fcfs mixed_short_first] [--rounds 3]

Every engine gets the same token-id requests (bench/workloads.py), greedy with ignore_eos.  Each figure is
measured in a fresh process of its own (as a server runs one engine per process), after the engine is built
and warmed up by a few requests through the same call: start-up is never timed.  Rounds interleave the
engines (ours, vllm, transformers; ours, vllm, transformers; ...), so a machine whose speed drifts treats
them alike; a figure is the median of its rounds, a ratio the median of the per-round ratios.  Both dtypes
run where the CPU has bf16 units, float32 elsewhere.  Results go to bench/results/<machine kind>/ with the
machine they ran on; the README's tables and plot come from them (bench/report.py).
"""

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import workloads
from bench.runners import RUNNERS, Timing, replay

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def load_figures(timings: list[Timing]) -> dict:
    tokens = sum(t.tokens for t in timings)
    span = max(t.finish for t in timings) - min(t.arrival for t in timings)
    ttft = [t.first_token - t.arrival for t in timings]
    latency = [t.finish - t.arrival for t in timings]
    return {
        "output_tokens": tokens,
        "tokens_per_s": tokens / span,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "latency_p50_s": percentile(latency, 50),
        "latency_p99_s": percentile(latency, 99),
    }


def mixed_figures(timings: list[Timing]) -> dict:
    short = [t.finish - t.arrival for t in timings if t.kind == "short"]
    return {**load_figures(timings), "short_latency_p95_s": percentile(short, 95)}


def batch_one_figures(timings: list[Timing]) -> dict:
    (timing,) = timings
    decode = (timing.tokens - 1) / (timing.finish - timing.first_token)
    return {"decode_tokens_per_s": decode, "ttft_s": timing.first_token - timing.arrival}


@dataclass(frozen=True)
class Scenario:
    engines: tuple[str, ...]
    requests: Callable  # (tokenizer, args) -> list[Request]
    figures: Callable[[list[Timing]], dict] | None = None  # None: offline, all requests in one call
    policy: str = "fcfs"
    max_num_seqs: int = 64


ALL = ("ours", "ours_int8", "ours_int8kv", "ours_int8_int8kv", "vllm", "transformers")
DEFAULT_ENGINES = ("ours", "vllm", "transformers")
SCENARIOS = {
    "offline": Scenario(ALL, lambda tok, args: workloads.offline(tok)),
    "short_chats": Scenario(ALL, lambda tok, args: workloads.short_chats(tok)),
    "online": Scenario(
        ALL[:-1],  # transformers' generate has no server loop
        lambda tok, args: workloads.online(tok, args.online_requests, args.rate),
        load_figures,
    ),
    "batch1": Scenario(ALL, lambda tok, args: workloads.batch_one(tok), batch_one_figures),
    # A server sized for 16 sequences at once: beyond that requests queue, and the policy decides.
    **{
        f"mixed_{policy}": Scenario(
            engines,
            lambda tok, args: workloads.mixed(tok, args.mixed_requests, args.mixed_rate),
            mixed_figures,
            policy,
            max_num_seqs=16,
        )
        for policy, engines in (("fcfs", ("ours", "vllm")), ("short_first", ("ours",)))
    },
}


def offline_figures(runner, warm_up: list, requests: list) -> dict:
    runner.offline(warm_up)  # builds the engine and runs every path once: not timed
    start = time.perf_counter()
    tokens = runner.offline(requests)
    return {"output_tokens": tokens, "tokens_per_s": tokens / (time.perf_counter() - start)}


async def streamed_figures(runner, warm_up: list, requests: list, figures: Callable) -> dict:
    """Warm-up and timed run in one event loop: vLLM's async engine is bound to the loop it began in."""
    await replay(runner, warm_up)
    return figures(await replay(runner, requests))


def worker(args) -> dict:
    """One engine, one scenario, in this process."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    scenario = SCENARIOS[args.scenario]
    runner = RUNNERS[args.engine](args.model, args.dtype, scenario.policy, scenario.max_num_seqs)
    warm_up, requests = workloads.warm_up(tokenizer), scenario.requests(tokenizer, args)
    try:
        if scenario.figures is None:
            return offline_figures(runner, warm_up, requests)
        return asyncio.run(streamed_figures(runner, warm_up, requests, scenario.figures))
    finally:
        runner.close()


def run_worker(engine: str, scenario: str, dtype: str, args) -> dict:
    python = args.vllm_python if engine == "vllm" else sys.executable
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
    # vLLM's CPU build keeps one core for its API process by default; on 2 cores that cost it 40 % of its
    # offline throughput (279 against 469 tok/s in bf16) and doubled its online TTFT p99, so it gets both.
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    options = ["--rate", str(args.rate), "--online-requests", str(args.online_requests)]
    options += ["--mixed-rate", str(args.mixed_rate), "--mixed-requests", str(args.mixed_requests)]
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [python, "-m", "bench.throughput", "--worker", engine, "--scenario", scenario]
        command += ["--model", args.model, "--dtype", dtype, "--out", out.name, *options]
        started = time.perf_counter()
        subprocess.run(command, check=True, env=env, cwd=ROOT)
        print(f"{dtype} {scenario} {engine}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
        return json.loads(Path(out.name).read_text())


def run_rounds(dtype: str, engines: list[str], args) -> dict[str, dict[str, list[dict]]]:
    """engine -> scenario -> the figures of each round."""
    rounds: dict = {engine: {} for engine in engines}
    for _ in range(args.rounds):
        for scenario in args.scenarios:
            for engine in [e for e in SCENARIOS[scenario].engines if e in engines]:
                figures = run_worker(engine, scenario, dtype, args)
                rounds[engine].setdefault(scenario, []).append(figures)
    return rounds


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": values}


def aggregate(rounds: dict[str, dict[str, list[dict]]]) -> dict:
    return {
        engine: {
            scenario: {metric: spread([each[metric] for each in runs]) for metric in runs[0]}
            for scenario, runs in scenarios.items()
        }
        for engine, scenarios in rounds.items()
    }


def ratios(rounds: dict[str, dict[str, list[dict]]], base: str) -> dict:
    """`base` against each other engine, round by round: above 1 is better for it (rates over, times
    under)."""
    found: dict = {}
    for peer in [p for p in rounds if p != base]:
        for scenario, runs in rounds.get(base, {}).items():
            for metric in runs[0]:
                pairs = list(zip(runs, rounds[peer].get(scenario, []), strict=False))
                if not pairs or metric == "output_tokens":
                    continue
                higher_is_better = "per_s" in metric
                per_round = [
                    ours[metric] / theirs[metric] if higher_is_better else theirs[metric] / ours[metric]
                    for ours, theirs in pairs
                ]
                found.setdefault(peer, {}).setdefault(scenario, {})[metric] = spread(per_round)
    return found


def weight_bytes(model: str, dtype: str) -> int:
    """What batch-1 decode reads per token: every weight once."""
    import torch
    from safetensors import safe_open

    from engine.model_files import weight_files

    elements = 0
    for file in weight_files(Path(model)):
        with safe_open(file, "pt") as tensors:
            for name in tensors.keys():  # noqa: SIM118 - safe_open objects are not iterable
                elements += math.prod(tensors.get_slice(name).get_shape())
    return elements * getattr(torch, dtype).itemsize


def measure(dtype: str, engines: list[str], machine: dict, args) -> dict:
    rounds = run_rounds(dtype, engines, args)
    weights = weight_bytes(args.model, dtype)
    return {
        "machine": machine,
        "dtype": dtype,
        "rounds": args.rounds,
        "scenarios": args.scenarios,
        "bandwidth_limit": {
            "weight_bytes": weights,
            "tokens_per_s": machine["read_bandwidth_gb_s"] * 1e9 / weights,
        },
        "engines": aggregate(rounds),
        "base": engines[0],
        "ratios": ratios(rounds, engines[0]),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="")
    parser.add_argument(
        "--dtypes", nargs="+", help="default: float32 and bfloat16 where the CPU has bf16 units"
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        default=list(DEFAULT_ENGINES),
        choices=ALL,
        help="the first is the one the ratios are of; ours_int8: ours with --quantization int8, ours_int8kv: "
        "with --kv-cache-dtype int8, ours_int8_int8kv: both",
    )
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vllm-python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python")
    parser.add_argument("--rate", type=float, default=4.0, help="online arrivals per second")
    parser.add_argument("--online-requests", type=int, default=64)
    parser.add_argument("--mixed-rate", type=float, default=1.5)
    parser.add_argument("--mixed-requests", type=int, default=60)
    parser.add_argument("--worker", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    parser.add_argument("--scenario", choices=list(SCENARIOS), help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.worker:
        args.engine = args.worker
        Path(args.out).write_text(json.dumps(worker(args)))
        return
    from bench.machine import describe, write_results
    from bench.report import write_report
    from engine.config import cpu_has_bf16_units
    from engine.default_model import default_model_dir

    args.model = args.model or str(default_model_dir())
    engines = list(args.engines)
    suffix = "" if engines == list(DEFAULT_ENGINES) else "_" + "_".join(engines)  # other engines, other file
    if "vllm" in engines and not args.vllm_python.exists():
        print(f"skipping vllm: {args.vllm_python} not found (make vllm-cpu)", file=sys.stderr)
        engines.remove("vllm")
    machine = describe(args.vllm_python)
    dtypes = args.dtypes or (["float32", "bfloat16"] if cpu_has_bf16_units() else ["float32"])
    for dtype in dtypes:
        results = measure(dtype, engines, machine, args)
        write_results(f"throughput_{dtype}{suffix}", results)
        print(write_report(results, ROOT / "docs" / f"throughput_{machine['kind']}_{dtype}{suffix}.png"))


if __name__ == "__main__":
    main()
