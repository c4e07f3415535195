"""What bounds our engine's decode: the time its matrix products need alone, against the whole step.

    .venv/bin/python -m bench.step_profile [--batch-sizes 1 32] [--new-tokens 64]

For each batch size: the engine decodes `--new-tokens` greedy tokens (ignore_eos) from 100-token chat
prompts (wall time per decode step, no profiler); then every linear layer of the model (lm_head included)
is timed alone on the same number of rows, through the forward the engine calls.  The rest of the step is
attention, norms, activations, per-op dispatch and our Python (scheduling, block tables, sampling).
torch.profiler is run once more to count the torch ops per step (our C++ kernels are not among them).
Results: bench/results/step_profile.json.
"""

import argparse
import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench import workloads
from engine import LLM, SamplingParams

RESULTS = Path(__file__).resolve().parent / "results" / "step_profile.json"


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


def matrix_seconds(model: torch.nn.Module, rows: int, repeats: int = 20) -> float:
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(rows, m.in_features, dtype=m.weight.dtype) for m in linears]
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


def measure(llm: LLM, batch_size: int, new_tokens: int) -> dict:
    step = decode_step_seconds(llm, batch_size, new_tokens)
    matrix = matrix_seconds(llm.engine.runner.model, batch_size)
    return {
        "batch_size": batch_size,
        "decode_step_ms": step * 1e3,
        "output_tokens_per_s": batch_size / step,
        "matrix_products_ms": matrix * 1e3,
        "matrix_share": matrix / step,
        "torch_ops_per_step": ops_per_step(llm, batch_size),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    from engine.default_model import default_model_dir

    llm = LLM(str(default_model_dir()))
    results = [measure(llm, size, args.new_tokens) for size in args.batch_sizes]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
