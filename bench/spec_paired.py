"""Speculation off and on at batch 1 in one process, request by request: the check on bench.speculative.

    .venv/bin/python -m bench.spec_paired [--rounds 6] [--dtype bfloat16]

bench.speculative runs each variant in a fresh process, one after another.  On a host whose speed shifts
for minutes at a time (the 2-core VMs here: batch-1 decode at ~100 or ~145 tok/s, in phases), its batch-1
ratios carry those phases.  Here both engines (the synchronous LLMEngine on one thread, so one OpenMP team)
live in one process and take each request in turn, which goes first alternating, so a phase falls on both
alike.  Workloads: bench.speculative's kb answers, rewrites and offline prompts, three requests each
(support chats, whose turns build on session KV, stay with bench.speculative).  A figure is decode tokens/s,
first token to last, over a round's requests; the ratio is the median of the per-round ratios.
Results: bench/results/<machine kind>/spec_paired_<dtype>.json.
"""

import argparse
import json
import time
from pathlib import Path

from bench import spec_workloads
from bench.machine import describe
from bench.speculative import spread
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

RESULTS = Path(__file__).resolve().parent / "results"
WORKLOADS = ("kb_answers", "rewrite", "offline")


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
    """A workload's figures over its paired rounds."""
    rates = {name: [d[name]["tokens"] / d[name]["seconds"] for d in rounds] for name in ("off", "ngram")}
    pairs = [(a, b) for d in rounds for a, b in zip(d["off"]["replies"], d["ngram"]["replies"], strict=True)]
    return {
        "off_tokens_per_s": spread(rates["off"]),
        "ngram_tokens_per_s": spread(rates["ngram"]),
        "speedup": spread([on / off for off, on in zip(rates["off"], rates["ngram"], strict=True)]),
        "equal_replies": [sum(a == b for a, b in pairs), len(pairs)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    from engine.default_model import default_model_dir

    model = str(default_model_dir())
    engines = {
        "off": LLMEngine(EngineConfig(model=model, dtype=args.dtype)),
        "ngram": LLMEngine(EngineConfig(model=model, dtype=args.dtype, speculative="ngram")),
    }
    tokenizer = engines["off"].tokenizer
    for name, engine in engines.items():  # warm-up, on prompts the rounds do not use
        for workload in WORKLOADS:
            warm_up = spec_workloads.requests(workload, tokenizer, 1, 99_000)[0]
            decode(engine, warm_up, f"warm-{name}-{workload}")
    figures = {}
    for workload in WORKLOADS:
        requests = spec_workloads.requests(workload, tokenizer, 3, 1000)
        figures[workload] = summarize([paired_round(engines, requests, r) for r in range(args.rounds)])
        print(workload, "ngram / off", round(figures[workload]["speedup"]["median"], 2), flush=True)
    machine = describe(None)
    path = RESULTS / machine["kind"] / f"spec_paired_{args.dtype}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine, **vars(args), "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
