import asyncio
from dataclasses import dataclass, field

import pytest

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.testing.oracle import reference_model
from memory.session_memory.config import MemoryConfig
from memory.session_memory.session_memory import SessionMemory

SYSTEM = "You are a helpful assistant for a bookshop. The customer's order number is 58213."
QUESTIONS = [
    "Hello! I need some help with an order.",
    "What is the order number you have on file?",
    "Can you suggest a good science fiction novel?",
    "Why is that one a good choice?",
    "Thanks. Please remind me of my order number.",
]


def memory_for(
    model_dir, data_dir, blocks=512, kv_cache_dtype="auto", speculative=None, **options
) -> SessionMemory:
    config = EngineConfig(
        model=model_dir,
        dtype="float32",
        num_kv_blocks=blocks,
        kv_cache_dtype=kv_cache_dtype,
        speculative=speculative,
    )
    engine = AsyncEngine(config)
    return SessionMemory(engine, MemoryConfig(data_dir=data_dir, **options))


@dataclass
class Turn:
    prompt_ids: list[int]
    reply_ids: list[int]
    reply: str
    cached: int
    prefilled: int


@dataclass
class Conversation:
    """Drives a chat through SessionMemory the way the chat service does: the whole history each turn."""

    memory: SessionMemory
    session_id: str
    max_tokens: int = 20
    messages: list[dict] = field(default_factory=lambda: [{"role": "system", "content": SYSTEM}])
    turns: list[Turn] = field(default_factory=list)

    def ask(self, question: str) -> Turn:
        self.messages.append({"role": "user", "content": question})
        tokenizer = self.memory.tokenizer
        prompt = tokenizer.apply_chat_template(self.messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        before = self.memory.stats().prefill_tokens_total
        deltas = asyncio.run(self.collect(prompt_ids))
        reply_ids = [t for d in deltas for t in d.token_ids]
        turn = Turn(
            prompt_ids,
            reply_ids,
            "".join(d.text for d in deltas),
            deltas[-1].num_cached_tokens,
            self.memory.stats().prefill_tokens_total - before,
        )
        self.messages.append({"role": "assistant", "content": turn.reply})
        self.turns.append(turn)
        return turn

    async def collect(self, prompt_ids):
        params = SamplingParams(temperature=0, max_tokens=self.max_tokens)
        request_id = f"{self.session_id}-{len(self.turns)}"
        return [
            d
            async for d in self.memory.generate(
                {"prompt_token_ids": prompt_ids}, params, request_id, self.session_id
            )
        ]


@pytest.fixture(scope="session")
def hf_models(smollm2_dir, tiny_model_dirs):
    dirs = {"smollm2": smollm2_dir, "qwen3": tiny_model_dirs["qwen3"]}
    return dirs, {name: reference_model(path) for name, path in dirs.items()}
