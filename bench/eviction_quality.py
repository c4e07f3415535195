"""Does a fact told early in a chat survive eviction?  Attention-based (sinks + heavy hitters + recent)
versus StreamingLLM (sinks + recent only), at the same budget: half of the conversation's tokens.

    .venv/bin/python -m bench.eviction_quality [--conversations 96] [--concurrency 8]
        [--dtype float32] [--kv-cache-dtypes auto int8]

Each generated conversation states a fact in its first message (an order number, a name, a code...),
then talks about other things, then asks for the fact.  Every conversation runs three times through
session memory: with no eviction (the reference), and with each policy at a budget of 50% of the tokens
the no-eviction run held before the question.  A run recalls the fact when the reply contains it.
Conversations run `--concurrency` at a time (the engine batches them; each keeps its own session).

Reported: each policy's recall, its recall where the full history recalls (a fact the model cannot give
back even without eviction says nothing about eviction), and the conversations where exactly one policy
recalls, with an exact two-sided sign test over them.  With several `--kv-cache-dtypes`, each runs the
whole benchmark in turn and the attention policy's recall is compared between the first and each other
KV dtype the same way.  Results: bench/results/eviction_quality.json (float32, auto), else
eviction_quality_<dtype>_<kv dtypes>.json.
"""

import argparse
import asyncio
import json
import math
import random
import tempfile
from dataclasses import replace
from pathlib import Path

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from memory.session_memory.config import MemoryConfig
from memory.session_memory.session_memory import SessionMemory

RESULTS = Path(__file__).resolve().parent / "results"
FACTS = [
    ("My order number is {value}.", "What is my order number?", lambda rng: str(rng.randint(10000, 99999))),
    (
        "My name is {value}.",
        "What is my name?",
        lambda rng: rng.choice(["Alice", "Bruno", "Chen", "Dana", "Emeka"]),
    ),
    (
        "My booking code is {value}.",
        "What is my booking code?",
        lambda rng: f"{rng.choice('ABCDEFGH')}{rng.randint(100, 999)}",
    ),
    (
        "I live in {value}.",
        "Which city do I live in?",
        lambda rng: rng.choice(["Lisbon", "Oslo", "Kyoto", "Lima", "Cairo"]),
    ),
]
FILLER = [
    "Can you explain how photosynthesis works?",
    "What are some tips for sleeping better?",
    "Tell me about the history of the bicycle.",
    "How do I make a simple tomato sauce?",
    "Why is the sky blue?",
    "What should I pack for a weekend hike?",
    "How does a refrigerator keep food cold?",
    "What is a good way to start learning the guitar?",
    "Can you suggest a few board games for a family evening?",
    "How do volcanoes form?",
    "What are the benefits of drinking enough water?",
    "How should I prepare for a job interview?",
]
SYSTEM = "You are a helpful assistant. Remember what the user tells you."


def conversation(index: int) -> tuple[list[str], str]:
    rng = random.Random(index)
    statement, question, make = FACTS[index % len(FACTS)]
    value = make(rng)
    fillers = rng.sample(FILLER, 3)
    return [statement.format(value=value) + " I have a few questions.", *fillers, question], value


async def run(
    memory: SessionMemory, session_id: str, messages_text: list[str], max_tokens: int
) -> tuple[str, int]:
    """Returns the last reply and the KV slots the session held before the last question."""
    tokenizer = memory.tokenizer
    messages = [{"role": "system", "content": SYSTEM}]
    reply, held = "", 0
    for turn, text in enumerate(messages_text):
        if turn == len(messages_text) - 1:
            held = (await memory.session_info(session_id)).cached_tokens
        messages.append({"role": "user", "content": text})
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        reply = "".join(
            [d.text async for d in memory.generate(prompt, params, f"{session_id}-{turn}", session_id)]
        )
        messages.append({"role": "assistant", "content": reply})
    return reply, held


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="")
    parser.add_argument("--conversations", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kv-cache-dtypes", nargs="+", default=["auto"], choices=["auto", "int8"])
    args = parser.parse_args()
    from engine.default_model import default_model_dir

    model = args.model or str(default_model_dir())
    kv_dtypes = args.kv_cache_dtypes
    results = {
        kv: evaluate(model, args.dtype, kv, args.conversations, args.max_tokens, args.concurrency)
        for kv in kv_dtypes
    }
    for kv in kv_dtypes[1:]:
        results[kv]["summary"]["attention_against_" + kv_dtypes[0]] = compare(
            results[kv]["rows"], results[kv_dtypes[0]]["rows"]
        )
    default = (args.dtype, kv_dtypes) == ("float32", ["auto"])
    name = "eviction_quality.json" if default else f"eviction_quality_{args.dtype}_{'_'.join(kv_dtypes)}.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / name).write_text(json.dumps(results["auto"] if default else results, indent=2))
    print(json.dumps({kv: result["summary"] for kv, result in results.items()}, indent=2))


def compare(rows: list[dict], baseline: list[dict]) -> dict:
    """The attention policy's recall in `rows` against `baseline`'s, conversation by conversation."""
    wins = sum(row["attention"] and not base["attention"] for row, base in zip(rows, baseline, strict=True))
    losses = sum(base["attention"] and not row["attention"] for row, base in zip(rows, baseline, strict=True))
    return {
        "only_this_recalls": wins,
        "only_baseline_recalls": losses,
        "sign_test_p": sign_test(wins, losses),
    }


def evaluate(
    model: str, dtype: str, kv_cache_dtype: str, count: int, max_tokens: int, concurrency: int
) -> dict:
    recent = 32
    engine = AsyncEngine(EngineConfig(model=model, dtype=dtype, kv_cache_dtype=kv_cache_dtype))
    with tempfile.TemporaryDirectory() as data_dir:
        memory = SessionMemory(engine, MemoryConfig(Path(data_dir), session_budget_tokens=8192))
        rows = asyncio.run(run_all(memory, count, max_tokens, concurrency, recent))
        memory.shutdown()
    recalled = [row for row in rows if row["full"]]
    attention_only = sum(row["attention"] and not row["recent"] for row in rows)
    recent_only = sum(row["recent"] and not row["attention"] for row in rows)
    summary = {
        "conversations": count,
        "budget": "50% of the KV the session held before the question",
        "recall_no_eviction": recall(rows, "full"),
        "recall_attention": recall(rows, "attention"),
        "recall_recent_only": recall(rows, "recent"),
        "recalled_without_eviction": len(recalled),
        "of_those_attention": recall(recalled, "attention"),
        "of_those_recent_only": recall(recalled, "recent"),
        "only_attention_recalls": attention_only,
        "only_recent_recalls": recent_only,
        "sign_test_p": sign_test(attention_only, recent_only),
    }
    return {"summary": summary, "rows": rows}


async def run_all(memory: SessionMemory, count: int, max_tokens: int, concurrency: int, recent: int):
    limit = asyncio.Semaphore(concurrency)

    async def without_eviction(index: int) -> dict:
        async with limit:
            messages, value = conversation(index)
            reply, held = await run(memory, f"full{index}", messages, max_tokens)
            await memory.drop(f"full{index}")
            return {"conversation": index, "fact": value, "budget": held // 2, "full": value in reply}

    async def with_eviction(row: dict, policy: str) -> None:
        async with limit:
            session_id = f"{policy}{row['conversation']}"
            memory.open_session(session_id, budget_tokens=row["budget"])
            reply, _ = await run(memory, session_id, conversation(row["conversation"])[0], max_tokens)
            row[policy] = row["fact"] in reply
            await memory.close_session(session_id)

    rows = await asyncio.gather(*(without_eviction(index) for index in range(count)))
    for policy, heavy in (("attention", True), ("recent", False)):
        memory.config = replace(memory.config, recent_tokens=recent, heavy_hitters=heavy)
        await asyncio.gather(*(with_eviction(row, policy) for row in rows))
    return list(rows)


def recall(rows: list[dict], key: str) -> float:
    return sum(row[key] for row in rows) / len(rows) if rows else float("nan")


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided p-value that wins and losses this lopsided come from a fair coin."""
    trials = wins + losses
    tail = sum(math.comb(trials, i) for i in range(min(wins, losses) + 1)) / 2**trials
    return min(1.0, 2 * tail)


if __name__ == "__main__":
    main()
