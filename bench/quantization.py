"""What int8 weights and the int8 KV cache cost in quality, measured on our engine: perplexity of a fixed
Chinese text, and greedy agreement with float32 over 70 chat prompts, for each variant side by side.

    .venv/bin/python -m bench.quantization [--model DIR] [--window 1024] [--max-tokens 32] [--text-tokens N]

Perplexity runs the text (its first `--text-tokens`, default all) through the engine in windows of
`--window` tokens (each window a prompt of its own, prefix caching off, one step each) and scores every
next token with the logits of the engine's own hidden states, taken step by step as the engine would, so
it measures the engine's arithmetic, kernels included: a window of at most 64 tokens runs the AVX2 kind's
few-row kernel, its decode products, on every layer and lm_head.  Agreement: prompts whose greedy output
equals float32's, and the share of tokens before the first difference.  Speed is bench.throughput's job
(`--engines ours_int8 ours`).  Results: bench/results/<machine kind>/quantization.json.
"""

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoTokenizer

from bench.bf16_agreement import compare
from bench.machine import describe, write_results
from engine import LLM, SamplingParams
from engine.testing.prompts import QUESTIONS

ROOT = Path(__file__).resolve().parent
TEXTS = {"en": ROOT / "data" / "perplexity_en.txt", "zh": ROOT / "data" / "perplexity_zh.txt"}
VARIANTS = {  # name -> engine options
    "float32": {"dtype": "float32"},
    "bfloat16": {"dtype": "bfloat16"},
    "bfloat16 + int8 weights": {"dtype": "bfloat16", "quantization": "int8"},
    "bfloat16 + int8 KV": {"dtype": "bfloat16", "kv_cache_dtype": "int8"},
    "bfloat16 + int8 weights + int8 KV": {
        "dtype": "bfloat16",
        "quantization": "int8",
        "kv_cache_dtype": "int8",
    },
}
CHINESE_QUESTIONS = [
    "法国的首都是哪里？",
    "请用两句话解释什么是光合作用。",
    "我的订单 4417 两周了还没到，怎么办？",
    "给我讲一个关于猫的笑话。",
    "列出三种颜色。",
    "《哈姆雷特》是谁写的？",
    "怎样在 Debian 上安装一个软件包？",
    "请把“早上好”翻译成英语。",
    "已经开始读的书可以退货吗？",
    "写一首关于大海的短诗。",
]


def agreement_prompts(tokenizer) -> list[str]:
    holdout = ROOT / "data" / "faq_paraphrases_holdout.jsonl"
    questions = [*QUESTIONS, *CHINESE_QUESTIONS]
    questions += [json.loads(line)["query"] for line in holdout.read_text().splitlines() if line.strip()]
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in questions
    ]


def perplexity(llm: LLM, token_ids: list[int], window: int) -> float:
    """exp(mean negative log-likelihood) of every token after the first of each window."""
    model = llm.engine.runner.model
    forward, hidden = model.forward, []
    model.forward = lambda *args, **kwargs: hidden.append(forward(*args, **kwargs)) or hidden[-1]
    total, count = 0.0, 0
    try:
        for start in range(0, len(token_ids) - 1, window):
            ids = token_ids[start : start + window]
            hidden.clear()
            llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=1))
            logits = torch.cat([model.logits(h) for h in hidden])[: len(ids) - 1].float().log_softmax(-1)
            targets = torch.tensor(ids[1:], device=logits.device)
            total -= logits.gather(1, targets[:, None]).sum().item()
            count += len(ids) - 1
    finally:
        model.forward = forward
    return float(torch.exp(torch.tensor(total / count)))


def measure_variant(model: str, options: dict, texts: dict, prompts: list[str], args) -> tuple[dict, list]:
    llm = LLM(model, enable_prefix_caching=False, max_num_batched_tokens=args.window, **options)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    greedy = [output.outputs[0].token_ids for output in llm.generate(prompts, params)]
    stats = llm.engine.stats()
    figures = {
        "perplexity": {
            language: round(perplexity(llm, ids, args.window), 4) for language, ids in texts.items()
        },
        "weight_bytes": stats.weight_bytes,
        "kv_bytes_per_token": stats.kv_pool_bytes // stats.kv_pool_tokens,
    }
    return figures, greedy


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="")
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--text-tokens", type=int, default=None)
    args = parser.parse_args()
    from engine.default_model import default_model_dir

    model = args.model or str(default_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = {
        language: tokenizer.encode(path.read_text())[: args.text_tokens] for language, path in TEXTS.items()
    }
    prompts = agreement_prompts(tokenizer)
    results, greedy = {}, {}
    for name, options in VARIANTS.items():
        results[name], greedy[name] = measure_variant(model, options, texts, prompts, args)
        print(name, results[name], flush=True)
    for name in VARIANTS:
        results[name]["greedy_agreement_with_float32"] = compare(greedy[name], greedy["float32"])
    machine = describe(None)
    output = {
        "machine": machine,
        "model": Path(model).name,
        "text_tokens": {k: len(v) for k, v in texts.items()},
        "prompts": len(prompts),
    }
    write_results("quantization", {**output, "window": args.window, "variants": results})
    print(json.dumps(results, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
