"""What bounds our engine's decode: the time its matrix products need alone, against the whole step.

    .venv/bin/python -m bench.step_profile [--dtype auto] [--quantizations none int8] [--batch-sizes 1 32]
        [--new-tokens 64] [--rounds 5]

For each weight format (one engine each, all in this process) and batch size: the engine decodes
`--new-tokens` greedy tokens (ignore_eos) from 100-token chat prompts (wall time per decode step, no
profiler); then every linear layer of the model (lm_head included) is timed alone on the same number of
rows, through the forward the engine calls.  Rounds interleave the formats, so a machine whose speed
drifts treats them alike; a figure is the median of its rounds.  The rest of the step is attention,
norms, activations, per-op dispatch and our Python (scheduling, block tables, sampling).  torch.profiler
is run once more to count the torch ops per step (our C++ kernels are not among them).
Results: bench/results/<machine kind>/step_profile_<dtype>.json.
"""

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench import workloads
from bench.machine import describe, write_results
from bench.throughput import spread
from engine import LLM, SamplingParams


def decode_step_seconds(llm: LLM, batch_size: int, new_tokens: int) -> float:
    prompts = [{"prompt_token_ids": workloads.chat_prompt(llm.tokenizer, i, 100)} for i in range(batch_size)]
    prefill_only = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate(prompts, prefill_only)  # warm-up
    start = time.perf_counter()
    llm.generate(prompts, prefill_only)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))
    return (time.perf_counter() - start - prefill) / (new_tokens - 1)


def matrix_seconds(llm: LLM, rows: int, repeats: int = 20) -> float:
    linears = [m for m in llm.engine.runner.model.modules() if isinstance(m, torch.nn.Linear)]
    # The compute dtype: an int8 layer's weight does not say it.
    inputs = [torch.randn(rows, m.in_features, dtype=llm.engine.dtype) for m in linears]
    for layer, x in zip(linears, inputs, strict=True):
        layer(x)
    start = time.perf_counter()
    for _ in range(repeats):
        for layer, x in zip(linears, inputs, strict=True):
            layer(x)
    return (time.perf_counter() - start) / repeats


def ops_per_step(llm: LLM, batch_size: int, steps: int = 8) -> float:
    prompts = [{"prompt_token_ids": workloads.chat_prompt(llm.tokenizer, i, 100)} for i in range(batch_size)]
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
    top_level = [e for e in profiler.events() if e.cpu_parent is None and e.name.startswith("aten::")]
    return len(top_level) / steps


def summarise(llm: LLM, batch_size: int, steps: list[float], products: list[float]) -> dict:
    rest = [(step - product) * 1e3 for step, product in zip(steps, products, strict=True)]
    step_ms = spread([step * 1e3 for step in steps])
    return {
        "batch_size": batch_size,
        "decode_step_ms": step_ms,
        "output_tokens_per_s": batch_size * 1e3 / step_ms["median"],
        "matrix_products_ms": spread([product * 1e3 for product in products]),
        "rest_of_step_ms": spread(rest),
        "torch_ops_per_step": ops_per_step(llm, batch_size),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantizations", nargs="+", default=["none"], choices=["none", "int8"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from engine.default_model import default_model_dir

    machine = describe(None)
    llms = {
        name: LLM(str(default_model_dir()), dtype=args.dtype, quantization=None if name == "none" else name)
        for name in args.quantizations
    }
    dtype = str(next(iter(llms.values())).engine.dtype).removeprefix("torch.")
    report = {"machine": machine, "dtype": dtype, "rounds": args.rounds, "quantizations": {}}
    for size in args.batch_sizes:
        steps = {name: [] for name in llms}
        products = {name: [] for name in llms}
        for _ in range(args.rounds):
            for name, llm in llms.items():
                steps[name].append(decode_step_seconds(llm, size, args.new_tokens))
                products[name].append(matrix_seconds(llm, size))
        for name, llm in llms.items():
            figures = summarise(llm, size, steps[name], products[name])
            report["quantizations"].setdefault(name, []).append(figures)
    write_results(f"step_profile_{dtype}", report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
