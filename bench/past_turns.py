"""Past turns that complement the session's KV: does a fact evicted from the KV come back by retrieval, and
what does retrieving turns the model still sees cost in reused prompt?

    .venv/bin/python -m bench.past_turns [--conversations 24] [--concurrency 8]

The conversations of bench.eviction_quality (a fact in the first message, three unrelated questions, then a
question about the fact) go through the whole chat service (retrieval, prompts, session memory) over its
OpenAI API, each in its own session, in five set-ups:
  full KV           a budget that never evicts; past turns as the service retrieves them (none in view)
  full KV, before   the same, with every past turn offered to retrieval (the behaviour before)
  evicted, none     a budget of 261 tokens (sinks + the recent 256 + one), no past turn ever retrieved
  evicted, ours     the same budget, turns the model no longer sees retrieved (the service as shipped)
  evicted, before   the same budget, every past turn offered to retrieval
Reported: recall of the fact (the reply contains it) and the share of prompt tokens reused from the KV, for
the final question and over all turns.  Results: bench/results/past_turns.json.
"""

import argparse
import asyncio
import json
import socket
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
import uvicorn

from bench.eviction_quality import SYSTEM, conversation
from bench.machine import describe
from chatsvc import turn_flow
from chatsvc.api.main import create_api
from chatsvc.settings import MIN_SESSION_BUDGET_TOKENS, Settings
from engine.default_model import default_model_dir

RESULTS = Path(__file__).parent / "results" / "past_turns.json"
KEY = "kvc-bench-past-turns"
NEVER_EVICTS = 8192


async def all_in_view(engine, session, path, limit) -> set[int]:
    return {message.id for message in path[:-1]}


async def none_in_view(engine, session, path, limit) -> set[int]:
    return set()


SETUPS = {  # name: (session KV budget, which past turns the model is taken to see)
    "full KV": (NEVER_EVICTS, turn_flow.messages_in_view),
    "full KV, before": (NEVER_EVICTS, none_in_view),
    "evicted, none": (MIN_SESSION_BUDGET_TOKENS, all_in_view),
    "evicted, ours": (MIN_SESSION_BUDGET_TOKENS, turn_flow.messages_in_view),
    "evicted, before": (MIN_SESSION_BUDGET_TOKENS, none_in_view),
}


def serve(settings: Settings) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(create_api(settings), port=settings.port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 300
    while not server.started or httpx.get(f"http://127.0.0.1:{settings.port}/health").status_code != 200:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.2)
    return server


async def chat(url: str, model: str, index: int, budget: int, max_tokens: int) -> dict:
    """One conversation in its own session: the fact's recall and each turn's prompt and reused tokens."""
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as rest:
        created = await rest.post("/api/sessions", json={"kv_budget_tokens": budget, "system_prompt": SYSTEM})
    session_id = created.json()["id"]
    messages, fact = conversation(index)
    turns = []
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=600) as client:
        for message in messages:
            reply = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": message}],
                max_tokens=max_tokens,
                temperature=0,
                extra_body={"session_id": session_id},
            )
            usage = reply.usage
            turns.append((usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens))
    return {"conversation": index, "recalled": fact in reply.choices[0].message.content, "turns": turns}


async def run_setup(url: str, budget: int, count: int, max_tokens: int, concurrency: int) -> list[dict]:
    limit = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY) as client:
        model = (await client.models.list()).data[0].id

    async def one(index: int) -> dict:
        async with limit:
            return await chat(url, model, index, budget, max_tokens)

    return await asyncio.gather(*(one(index) for index in range(count)))


def summary(rows: list[dict]) -> dict:
    last = [row["turns"][-1] for row in rows]
    every = [turn for row in rows for turn in row["turns"]]
    return {
        "recall": sum(row["recalled"] for row in rows) / len(rows),
        "question_reused_share": sum(c for _, c in last) / sum(p for p, _ in last),
        "all_turns_reused_share": sum(c for _, c in every) / sum(p for p, _ in every),
        "question_prompt_tokens": sum(p for p, _ in last) / len(last),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    report = {"machine": describe(None), "dtype": args.dtype, "setups": {}}
    with tempfile.TemporaryDirectory() as folder:
        settings = Settings(
            data_dir=Path(folder), model=str(default_model_dir()), api_key=KEY, port=port, dtype=args.dtype
        )
        server = serve(settings)
        url = f"http://127.0.0.1:{port}"
        for name, (budget, in_view) in SETUPS.items():
            turn_flow.messages_in_view = in_view
            rows = asyncio.run(run_setup(url, budget, args.conversations, args.max_tokens, args.concurrency))
            report["setups"][name] = {"budget": budget, "summary": summary(rows), "rows": rows}
            print(name, json.dumps(report["setups"][name]["summary"]), flush=True)
        server.should_exit = True
    RESULTS.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
