"""Does a fact told early in a chat survive eviction?  Attention-based (sinks + heavy hitters + recent)
versus StreamingLLM (sinks + recent only), at the same budget: half of the conversation's tokens.

    .venv/bin/python -m bench.eviction_quality [--conversations 24]

Each generated conversation states a fact in its first message (an order number, a name, a code...),
then talks about other things, then asks for the fact.  Every conversation runs three times through
session memory: with no eviction (the reference), and with each policy at a budget of 50% of the tokens
the no-eviction run held before the question.  A run recalls the fact when the reply contains it.
Results: bench/results/eviction_quality.json.
"""

import argparse
import asyncio
import json
import random
import tempfile
from dataclasses import replace
from pathlib import Path

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from memory.sessions.config import MemoryConfig
from memory.sessions.session_memory import SessionMemory

RESULTS = Path(__file__).resolve().parent / "results" / "eviction_quality.json"
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
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    from engine.default_model import default_model_dir

    model = args.model or str(default_model_dir())
    results = evaluate(model, args.conversations, args.max_tokens)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(json.dumps(results["summary"], indent=2))


def evaluate(model: str, count: int, max_tokens: int, recent: int = 32) -> dict:
    engine = AsyncEngine(EngineConfig(model=model, dtype="float32"))
    rows = []
    with tempfile.TemporaryDirectory() as data_dir:
        memory = SessionMemory(engine, MemoryConfig(Path(data_dir), session_budget_tokens=8192))
        for index in range(count):
            messages, value = conversation(index)
            reply, held = asyncio.run(run(memory, f"full{index}", messages, max_tokens))
            rows.append({"conversation": index, "fact": value, "budget": held // 2, "full": value in reply})
            asyncio.run(memory.drop(f"full{index}"))
        for policy, heavy in (("attention", True), ("recent", False)):
            memory.config = replace(memory.config, recent_tokens=recent, heavy_hitters=heavy)
            for row in rows:
                session_id = f"{policy}{row['conversation']}"
                memory.open_session(session_id, budget_tokens=row["budget"])
                reply, _ = asyncio.run(
                    run(memory, session_id, conversation(row["conversation"])[0], max_tokens)
                )
                row[policy] = row["fact"] in reply
                asyncio.run(memory.close_session(session_id))
        memory.shutdown()
    summary = {
        "conversations": count,
        "budget": "50% of the KV the session held before the question",
        "recall_no_eviction": recall(rows, "full"),
        "recall_attention": recall(rows, "attention"),
        "recall_recent_only": recall(rows, "recent"),
    }
    return {"summary": summary, "rows": rows}


def recall(rows: list[dict], key: str) -> float:
    return sum(row[key] for row in rows) / len(rows)


if __name__ == "__main__":
    main()
