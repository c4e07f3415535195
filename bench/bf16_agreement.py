"""How often our greedy tokens agree with transformers' when both run in bfloat16.

    .venv/bin/python -m bench.bf16_agreement [--models DIR ...] [--max-tokens 24]

In float32 the engine's greedy output equals transformers' token for token (tests/engine); in bfloat16
rounding differs where the computations differ (our decode attention accumulates in float32, for one),
and a greedy run that differs once goes its own way.  Reported per model, for ours against transformers
in bf16, and for each bf16 run against transformers in float32: prompts whose whole output is identical,
and the share of tokens before the first difference.  Results: bench/results/bf16.json.
"""

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoTokenizer

from engine import LLM, SamplingParams
from engine.session_kv import common_prefix
from engine.testing.oracle import reference_greedy, reference_model
from engine.testing.prompts import chat_prompts

RESULTS = Path(__file__).resolve().parent / "results" / "bf16.json"


def agreement(model_dir: str, max_tokens: int) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = chat_prompts(tokenizer)
    llm = LLM(model_dir, dtype="bfloat16", num_kv_blocks=512)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    ours = [output.outputs[0].token_ids for output in llm.generate(prompts, params)]
    prompt_ids = [tokenizer.encode(prompt, add_special_tokens=False) for prompt in prompts]
    bf16, bf16_logits = reference_outputs(model_dir, torch.bfloat16, prompt_ids, max_tokens)
    float32, float32_logits = reference_outputs(model_dir, torch.float32, prompt_ids, max_tokens)
    return {
        "prompts": len(prompts),
        "ours_vs_transformers_bf16": compare(ours, bf16),
        # Which bf16 run stays closer to the float32 result (the one the tests prove ours equal to):
        "ours_bf16_vs_float32": compare(ours, float32),
        "transformers_bf16_vs_float32": compare(bf16, float32),
        # Before any greedy choice: RMS distance of each prompt's first-token logits from float32's.
        "first_token_logits_rms_from_float32": {
            "ours_bf16": rms_distances(first_token_logits(llm, prompt_ids), float32_logits),
            "transformers_bf16": rms_distances(bf16_logits, float32_logits),
        },
    }


def first_token_logits(llm: LLM, prompt_ids: list[list[int]]) -> list[torch.Tensor]:
    """The logits our engine samples the first token from, caught at the model's output."""
    model = llm.engine.runner.model
    caught = []
    compute_logits = model.logits
    model.logits = lambda hidden: caught.append(compute_logits(hidden)) or caught[-1]
    for ids in prompt_ids:
        llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=1))
    model.logits = compute_logits
    return [logits[-1].float() for logits in caught]


def rms_distances(logits: list[torch.Tensor], exact: list[torch.Tensor]) -> list[float]:
    return [
        round((got.cpu() - want).pow(2).mean().sqrt().item(), 4)
        for got, want in zip(logits, exact, strict=True)
    ]


@torch.no_grad()
def reference_outputs(model_dir: str, dtype: torch.dtype, prompt_ids: list[list[int]], max_tokens: int):
    """transformers' greedy runs and the logits of each prompt's first token."""
    reference = reference_model(model_dir, dtype)
    device = next(reference.parameters()).device
    runs = [reference_greedy(reference, ids, max_tokens) for ids in prompt_ids]
    logits = [reference(torch.tensor([ids], device=device)).logits[0, -1].float().cpu() for ids in prompt_ids]
    return runs, logits


def compare(runs: list[list[int]], expected_runs: list[list[int]]) -> dict:
    """Runs identical to the expected ones, and the share of tokens before each run's first difference."""
    identical = sum(run == expected for run, expected in zip(runs, expected_runs, strict=True))
    agreed = sum(common_prefix(expected, run) for run, expected in zip(runs, expected_runs, strict=True))
    return {"identical": identical, "token_agreement": agreed / sum(map(len, expected_runs))}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=[])
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    from engine.default_model import default_model_dir

    models = args.models or [str(default_model_dir())]
    results = {Path(model).name: agreement(model, args.max_tokens) for model in models}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
