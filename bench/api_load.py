"""Load through the API: N concurrent streamed chats with the openai client; none may be lost.

Reports throughput and p50/p99 time to first token, and checks every reply is stored as it streamed.

    python bench/api_load.py                       # starts its own server (bundled model, temp data dir)
    python bench/api_load.py --url http://127.0.0.1:7860 --api-key KEY
"""

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import openai

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "api_load.json"
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three colors.",
    "Tell me a joke about cats.",
    "Translate 'good morning' into Spanish.",
    "Explain photosynthesis to a child.",
    "Name two planets.",
    "What is 12 times 12?",
]


@dataclass
class Chat:
    session_id: str
    message_id: int
    text: str
    completion_tokens: int
    ttft_s: float
    total_s: float


async def one_chat(client: openai.AsyncOpenAI, model: str, question: str, max_tokens: int) -> Chat:
    started = time.perf_counter()
    first_token_at, text, chunk = None, "", None
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first_token_at = first_token_at or time.perf_counter()
            text += chunk.choices[0].delta.content
    finished = time.perf_counter()
    ttft = (first_token_at or finished) - started
    return Chat(
        chunk.session_id, chunk.message_id, text, chunk.usage.completion_tokens, ttft, finished - started
    )


def stored_replies_match(url: str, api_key: str, chats: list[Chat]) -> list[str]:
    """Problems found comparing each streamed reply with what the server stored."""
    problems = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30) as http:
        for chat in chats:
            stored = http.get(f"/api/messages/{chat.message_id}").json()
            if stored.get("status") != "done" or stored.get("content") != chat.text:
                problems.append(f"message {chat.message_id}: stored {stored.get('status')!r}, text differs")
    return problems


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def run_load(url: str, api_key: str, concurrency: int, max_tokens: int) -> dict:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=600)
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(concurrency)]
    model = (await client.models.list()).data[0].id
    started = time.perf_counter()
    outcomes = await asyncio.gather(
        *(one_chat(client, model, q, max_tokens) for q in questions), return_exceptions=True
    )
    wall = time.perf_counter() - started
    chats = [o for o in outcomes if isinstance(o, Chat)]
    failures = [repr(o) for o in outcomes if not isinstance(o, Chat)]
    failures += stored_replies_match(url, api_key, chats)
    tokens = sum(chat.completion_tokens for chat in chats)
    ttfts = [chat.ttft_s for chat in chats]
    return {
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "completed": len(chats),
        "lost_or_failed": len(failures),
        "failures": failures[:5],
        "wall_s": round(wall, 2),
        "completion_tokens": tokens,
        "throughput_tok_s": round(tokens / wall, 1),
        "requests_per_s": round(len(chats) / wall, 2),
        "ttft_p50_s": round(statistics.median(ttfts), 3) if ttfts else None,
        "ttft_p99_s": round(percentile(ttfts, 0.99), 3) if ttfts else None,
        "chats": [asdict(chat) for chat in chats],
    }


def start_server(port: int, api_key: str, data_dir: str) -> subprocess.Popen:
    command = [sys.executable, "app.py", "--port", str(port), "--api-key", api_key, "--data-dir", data_dir]
    server = subprocess.Popen(command, cwd=REPO, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    server.kill()
    sys.exit("error: the server did not become healthy (run python app.py to see why)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a running server; default: start one on port --port")
    parser.add_argument("--api-key", default="kvc-bench-key")
    parser.add_argument("--port", type=int, default=7899)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    server = None
    with tempfile.TemporaryDirectory(prefix="kvchat-bench-") as data_dir:
        if args.url is None:
            server = start_server(args.port, args.api_key, data_dir)
        try:
            result = asyncio.run(
                run_load(
                    args.url or f"http://127.0.0.1:{args.port}",
                    args.api_key,
                    args.concurrency,
                    args.max_tokens,
                )
            )
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=60)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    summary = {key: value for key, value in result.items() if key != "chats"}
    print(json.dumps(summary, indent=2))
    if result["lost_or_failed"]:
        sys.exit(f"error: {result['lost_or_failed']} chats lost or failed")


if __name__ == "__main__":
    main()
