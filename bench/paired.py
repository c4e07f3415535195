"""Two engine variants at batch 1 in one process, request by request: the check on a fresh-process bench.

    .venv/bin/python -m bench.paired --pair speculative|int8 [--rounds 6] [--dtype bfloat16]

bench.speculative and bench.throughput run each variant in a fresh process, one after another.  On a host
whose speed shifts for minutes at a time (the 2-core VMs here: batch-1 decode at ~100 or ~145 tok/s, in
phases), their batch-1 ratios carry those phases.  Here both engines (the synchronous LLMEngine on one
thread, so one OpenMP team) live in one process and take each request in turn, which goes first
alternating, so a phase falls on both alike.  Pairs: `speculative` (off, ngram) on bench.speculative's kb
answers, rewrites and offline prompts (support chats, whose turns build on session KV, stay with
bench.speculative); `int8` (bf16, int8 weights) on chat prompts of bench.throughput's batch-1 length.
A figure is decode tokens/s, first token to last, over a round's requests; the ratio is the median of the
per-round ratios.  Results: bench/results/<machine kind>/paired_<pair>_<dtype>.json.
"""

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench import spec_workloads, workloads
from bench.machine import describe, write_results
from bench.throughput import spread
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams


def chat_requests(workload: str, tokenizer, count: int, seed: int) -> list[spec_workloads.Request]:
    """bench.throughput's batch-1 request (a 100-token chat prompt, 128 new tokens), one per seed."""
    return [
        spec_workloads.Request(workloads.chat_prompt(tokenizer, seed + i, 100), 128, True)
        for i in range(count)
    ]


@dataclass(frozen=True)
class Pair:
    variants: dict[str, dict]  # name -> EngineConfig options; the first is the baseline
    workloads: tuple[str, ...]
    requests: Callable  # (workload, tokenizer, count, seed) -> requests


PAIRS = {
    "speculative": Pair(
        {"off": {}, "ngram": {"speculative": "ngram"}},
        ("kb_answers", "rewrite", "offline"),
        spec_workloads.requests,
    ),
    "int8": Pair({"bf16": {}, "int8": {"quantization": "int8"}}, ("chat",), chat_requests),
}


def decode(engine: LLMEngine, request: spec_workloads.Request, request_id: str) -> tuple[list[int], float]:
    """The greedy reply and the seconds from its first token to its last."""
    params = SamplingParams(temperature=0, max_tokens=request.max_tokens, ignore_eos=request.ignore_eos)
    engine.add_request(request_id, {"prompt_token_ids": request.prompt_token_ids}, params)
    tokens, first = [], None
    while engine.has_unfinished_requests():
        for update in engine.step():
            tokens += update.new_token_ids
            first = first or time.perf_counter()
    return tokens, time.perf_counter() - first


def paired_round(engines: dict[str, LLMEngine], requests: list, round_index: int) -> dict:
    decoded = {name: {"tokens": 0, "seconds": 0.0, "replies": []} for name in engines}
    for i, request in enumerate(requests):
        names = list(engines) if (round_index + i) % 2 == 0 else list(engines)[::-1]
        for name in names:
            tokens, seconds = decode(engines[name], request, f"{name}-{round_index}-{i}")
            decoded[name]["tokens"] += len(tokens) - 1
            decoded[name]["seconds"] += seconds
            decoded[name]["replies"].append(tokens)
    return decoded


def summarize(rounds: list[dict]) -> dict:
    """A workload's figures over its paired rounds: the first variant is the baseline of the ratio."""
    base, other = rounds[0]
    rates = {name: [d[name]["tokens"] / d[name]["seconds"] for d in rounds] for name in (base, other)}
    pairs = [(a, b) for d in rounds for a, b in zip(d[base]["replies"], d[other]["replies"], strict=True)]
    return {
        f"{base}_tokens_per_s": spread(rates[base]),
        f"{other}_tokens_per_s": spread(rates[other]),
        "speedup": spread([b / a for a, b in zip(rates[base], rates[other], strict=True)]),
        "equal_replies": [sum(a == b for a, b in pairs), len(pairs)],
    }


def build(pair: Pair, dtype: str) -> dict[str, LLMEngine]:
    """The pair's engines, each warmed up on every workload with prompts the rounds do not use."""
    from engine.default_model import default_model_dir

    model = str(default_model_dir())
    engines = {
        name: LLMEngine(EngineConfig(model=model, dtype=dtype, **o)) for name, o in pair.variants.items()
    }
    for name, engine in engines.items():
        for workload in pair.workloads:
            warm_up = pair.requests(workload, engine.tokenizer, 1, 99_000)[0]
            decode(engine, warm_up, f"warm-{name}-{workload}")
    return engines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pair", choices=sorted(PAIRS), default="speculative")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    pair = PAIRS[args.pair]
    engines = build(pair, args.dtype)
    base, other = pair.variants
    figures = {}
    for workload in pair.workloads:
        requests = pair.requests(workload, engines[base].tokenizer, 3, 1000)
        figures[workload] = summarize([paired_round(engines, requests, r) for r in range(args.rounds)])
        print(workload, f"{other} / {base}", round(figures[workload]["speedup"]["median"], 2), flush=True)
    write_results(
        f"paired_{args.pair}_{args.dtype}", {"machine": describe(None), **vars(args), "figures": figures}
    )


if __name__ == "__main__":
    main()
