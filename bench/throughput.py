"""Throughput and latency of our engine beside transformers' generate and vLLM's CPU build, in one run.

    .venv/bin/python -m bench.throughput [--engines transformers ours vllm] [--vllm-python PATH]

Each engine runs in its own process, one after another, on the same token-id requests (bench/workloads.py):
offline (32 chat requests, 128 new tokens each, all at once), online (Poisson arrivals through each
engine's streaming interface), batch-1 decode, and the mixed load (70/20/10 short/medium/long) under FCFS
and under our short-first policy.  Greedy, ignore_eos.  Results: bench/results/throughput.json and
docs/throughput.png; the README's table comes from them.
"""

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import workloads
from bench.runners import RUNNERS, replay

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "throughput.json"
PLOT = ROOT / "docs" / "throughput.png"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summarize(timings) -> dict:
    tokens = sum(t.tokens for t in timings)
    span = max(t.finish for t in timings) - min(t.arrival for t in timings)
    ttft = [t.first_token - t.arrival for t in timings]
    latency = [t.finish - t.arrival for t in timings]
    return {
        "requests": len(timings),
        "output_tokens": tokens,
        "tokens_per_s": tokens / span,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "latency_p50_s": percentile(latency, 50),
        "latency_p99_s": percentile(latency, 99),
    }


async def streaming(runner, tokenizer, args) -> dict:
    """Warm-up, batch 1 and online in one event loop: vLLM's async engine is bound to the loop it began in."""
    results = {}
    await replay(runner, workloads.batch_one(tokenizer, 8))  # warm-up
    if "batch1" in args.scenarios:
        (timing,) = await replay(runner, workloads.batch_one(tokenizer))
        decode = (timing.tokens - 1) / (timing.finish - timing.first_token)
        results["batch1"] = {"decode_tokens_per_s": decode, "ttft_s": timing.first_token - timing.arrival}
    if "online" in args.scenarios and args.engine != "transformers":  # generate has no server loop
        requests = workloads.online(tokenizer, args.online_requests, args.rate)
        results["online"] = summarize(await replay(runner, requests))
    return results


def worker(args) -> dict:
    """Runs inside one engine's process."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    runner_class = RUNNERS[args.engine]
    results = {}
    if "offline" in args.scenarios:
        requests = workloads.offline(tokenizer)
        runner = runner_class(args.model, args.dtype)
        start = time.perf_counter()
        tokens = runner.offline(requests)
        results["offline"] = {"output_tokens": tokens, "tokens_per_s": tokens / (time.perf_counter() - start)}
        runner.close()
    if "batch1" in args.scenarios or "online" in args.scenarios:
        runner = runner_class(args.model, args.dtype)
        results.update(asyncio.run(streaming(runner, tokenizer, args)))
        runner.close()
    if "mixed" in args.scenarios and args.engine != "transformers":
        policies = ["fcfs", "short_first"] if args.engine == "ours" else ["fcfs"]
        for policy in policies:
            # A server sized for 16 sequences at once: beyond that requests queue, and the policy decides.
            runner = runner_class(args.model, args.dtype, policy, max_num_seqs=16)
            timings = asyncio.run(
                replay(runner, workloads.mixed(tokenizer, args.mixed_requests, args.mixed_rate))
            )
            short = [t.finish - t.arrival for t in timings if t.kind == "short"]
            results[f"mixed_{policy}"] = {**summarize(timings), "short_latency_p95_s": percentile(short, 95)}
            runner.close()
    return results


def memory_bandwidth_limit(model: str, dtype: str) -> dict:
    """Batch-1 decode reads every weight once per token: bytes per token over measured read bandwidth."""
    import torch
    from safetensors import safe_open

    from engine.model_files import weight_files

    elements = 0
    for file in weight_files(Path(model)):
        with safe_open(file, "pt") as tensors:
            for name in tensors.keys():  # noqa: SIM118 - safe_open objects are not iterable
                elements += math.prod(tensors.get_slice(name).get_shape())
    weights = elements * getattr(torch, dtype).itemsize
    buffer = torch.ones(256 * 2**20 // 4)
    buffer.sum()
    start = time.perf_counter()
    for _ in range(10):
        buffer.sum()
    bandwidth = 10 * buffer.numel() * 4 / (time.perf_counter() - start)
    return {
        "weight_bytes": weights,
        "read_bandwidth_gb_s": bandwidth / 1e9,
        "limit_tokens_per_s": bandwidth / weights,
    }


def run_engine(engine: str, args) -> dict:
    """Each scenario in a fresh process of its own, as a server runs one engine per process: a process
    whose main thread has run torch's parallel ops slows an engine stepping on another thread (see
    engine/async_engine.py), and the offline scenario runs on the main thread."""
    python = args.vllm_python if engine == "vllm" else sys.executable
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
    results: dict = {}
    started = time.perf_counter()
    for scenario in args.scenarios:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            command = [
                python,
                "-m",
                "bench.throughput",
                "--worker",
                engine,
                "--model",
                args.model,
                "--dtype",
                args.dtype,
                "--out",
                out.name,
                "--scenarios",
                scenario,
                "--rate",
                str(args.rate),
                "--mixed-rate",
                str(args.mixed_rate),
                "--online-requests",
                str(args.online_requests),
                "--mixed-requests",
                str(args.mixed_requests),
            ]
            subprocess.run(command, check=True, env=env, cwd=ROOT)
            results.update(json.loads(Path(out.name).read_text()))
    print(f"{engine}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="")
    parser.add_argument(
        "--dtype", default="auto", help="float32 or bfloat16; auto = what our engine picks here"
    )
    parser.add_argument("--engines", nargs="+", default=["transformers", "ours", "vllm"])
    parser.add_argument("--scenarios", nargs="+", default=["offline", "online", "batch1", "mixed"])
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--rate", type=float, default=0.6, help="online arrivals per second")
    parser.add_argument("--online-requests", type=int, default=48)
    parser.add_argument("--mixed-rate", type=float, default=1.5)
    parser.add_argument("--mixed-requests", type=int, default=60)
    parser.add_argument("--worker", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.engine = args.worker
        Path(args.out).write_text(json.dumps(worker(args)))
        return
    from bench.report import write_report
    from engine.config import resolve_device, resolve_dtype
    from engine.default_model import default_model_dir

    args.model = args.model or str(default_model_dir())
    args.dtype = str(resolve_dtype(args.dtype, resolve_device("auto"))).removeprefix("torch.")
    results = {"dtype": args.dtype, "cpu_count": os.cpu_count(), "engines": {}}
    results["bandwidth"] = memory_bandwidth_limit(args.model, args.dtype)
    for engine in args.engines:
        if engine == "vllm" and not Path(args.vllm_python).exists():
            print(f"skipping vllm: {args.vllm_python} not found (make vllm-cpu)", file=sys.stderr)
            continue
        results["engines"][engine] = run_engine(engine, args)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(write_report(results, PLOT))


if __name__ == "__main__":
    main()
