"""Where a decode step's time goes in our engine: matrix products, attention, other torch ops, and what no
torch op accounts for (Python: scheduling, block tables, sampling glue).

    .venv/bin/python -m bench.step_profile [--batch-sizes 1 32] [--new-tokens 64]

Each batch decodes `--new-tokens` greedy tokens (ignore_eos) from 100-token chat prompts after a warm-up;
torch.profiler times every op on the CPU.  Results: bench/results/step_profile.json.
"""

import argparse
import json
import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from bench import workloads
from engine import LLM, SamplingParams

RESULTS = Path(__file__).resolve().parent / "results" / "step_profile.json"
MATRIX_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"}
ATTENTION_OPS = ("paged_attention", "scaled_dot_product", "attention")


def category(op_name: str) -> str:
    if op_name in MATRIX_OPS:
        return "matrix"
    if any(part in op_name for part in ATTENTION_OPS):
        return "attention"
    return "other ops"


def profile_batch(llm: LLM, batch_size: int, new_tokens: int) -> dict:
    prompts = [{"prompt_token_ids": workloads.chat_prompt(llm.tokenizer, i, 100)} for i in range(batch_size)]
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        start = time.perf_counter()
        llm.generate(prompts, params)
        wall = time.perf_counter() - start
    seconds = {"matrix": 0.0, "attention": 0.0, "other ops": 0.0}
    for event in profiler.key_averages():
        seconds[category(event.key)] += event.self_cpu_time_total / 1e6
    seconds["not in torch ops"] = max(0.0, wall - sum(seconds.values()))
    return {
        "batch_size": batch_size,
        "wall_s": wall,
        "output_tokens_per_s": batch_size * new_tokens / wall,
        "share": {name: value / wall for name, value in seconds.items()},
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
    results = [profile_batch(llm, size, args.new_tokens) for size in args.batch_sizes]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
