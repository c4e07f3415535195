"""What a lent GPU machine checks in one short run; nothing can be downloaded there.

    python -m bench.gpu_check prepare --gguf FILE --cache-dir DIR
    KVCHAT_MODEL_CACHE_DIR=DIR python -m pytest tests/engine tests/memory/session_memory
    python -m bench.gpu_check measure --cache-dir DIR --out FILE

`prepare` converts the bundled SmolLM2 GGUF (carried there) as `make` does here, and builds the tiny
models.  The engine tests then run on CUDA, with transformers' oracle on the same GPU (tests/reference.py).
`measure` times our engine against transformers' generate on the GPU, in bfloat16 and float32 (batch-1
decode; an offline batch), and reports bf16 agreement there.  vLLM is not measured: the GPU image has no
vllm, and its wheels are larger than what one call can carry.  bench/gpu_check.sh is the whole run.
"""

import argparse
import asyncio
import json
from pathlib import Path

from bench import workloads
from bench.bf16_agreement import agreement
from bench.runners import OursRunner, TransformersRunner
from bench.throughput import batch_one_figures, offline_figures, streamed_figures
from engine.default_model import FOLDER_NAME, convert
from engine.testing.tiny_models import TINY_CONFIGS, build_tiny_model


def prepare(gguf: Path, cache_dir: Path) -> None:
    smollm2 = cache_dir / FOLDER_NAME
    convert(gguf, smollm2)
    for family in TINY_CONFIGS:
        build_tiny_model(family, smollm2, cache_dir / f"tiny-{family}")


class OursOffline:
    def __init__(self, model: str, dtype: str, max_num_seqs: int):
        from engine import LLM

        # Prefill chunks sized for a GPU, and KV room for the whole batch (no preemption).
        self.llm = LLM(
            model,
            dtype=dtype,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=4096,
            kv_cache_memory_gb=12,
        )

    def offline(self, requests) -> int:
        outputs = self.llm.generate(
            [{"prompt_token_ids": r.prompt_token_ids} for r in requests],
            [OursRunner.params(r.max_tokens) for r in requests],
        )
        return sum(len(o.outputs[0].token_ids) for o in outputs)


def speed(name: str, model: str, dtype: str, batch: int) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    offline_class, runner_class = {
        "ours": (OursOffline, OursRunner),
        "transformers": (TransformersRunner, TransformersRunner),
    }[name]
    # The whole batch at once, as transformers' generate takes it.
    offline_runner = offline_class(model, dtype, max_num_seqs=batch)
    requests = workloads.offline(tokenizer, count=batch)
    warm_up = workloads.warm_up(tokenizer)
    # Both read their outputs back to the CPU, so the clock stops when the GPU is done.
    result = {"offline_tokens_per_s": offline_figures(offline_runner, warm_up, requests)["tokens_per_s"]}
    runner = runner_class(model, dtype)
    one = workloads.batch_one(tokenizer)
    result.update(asyncio.run(streamed_figures(runner, warm_up, one, batch_one_figures)))
    runner.close()
    return result


def measure(cache_dir: Path, batch: int) -> dict:
    import torch

    model = str(cache_dir / FOLDER_NAME)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    results = {"device": device, "torch": torch.__version__, "offline_requests": batch, "runs": []}
    # Twice, in opposite orders: a shared machine's first minutes can be slower than its later ones.
    for dtypes in (("bfloat16", "float32"), ("float32", "bfloat16")):
        for dtype in dtypes:
            for name in ("ours", "transformers"):
                results["runs"].append({"engine": name, "dtype": dtype, **speed(name, model, dtype, batch)})
                print(results["runs"][-1], flush=True)
    models = [model, *(str(cache_dir / f"tiny-{family}") for family in TINY_CONFIGS)]
    results["bf16_agreement"] = {Path(m).name: agreement(m, max_tokens=24) for m in models}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("step", choices=["prepare", "measure"])
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--gguf", type=Path, help="the bundled SmolLM2 GGUF (prepare)")
    parser.add_argument("--out", type=Path, help="results JSON (measure)")
    parser.add_argument("--offline-requests", type=int, default=256, help="the offline batch (measure)")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.gguf, args.cache_dir)
    else:
        results = measure(args.cache_dir, args.offline_requests)
        args.out.write_text(json.dumps(results, indent=2))
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
