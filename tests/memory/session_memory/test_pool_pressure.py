"""More sessions than the KV pool holds: idle sessions move to disk, nothing deadlocks, replies stay exact."""

import asyncio

import pytest

from engine.sampling_params import SamplingParams
from tests.memory.session_memory.conftest import memory_for

TOPICS = ["trains", "volcanoes", "bees", "chess", "tea", "glaciers"]


def prompt(tokenizer, topic: str, turns: int) -> str:
    messages = []
    for turn in range(turns):
        messages.append(
            {"role": "user", "content": f"Tell me fact number {turn + 1} about {topic}, in detail."}
        )
        if turn < turns - 1:
            messages.append({"role": "assistant", "content": f"Here is fact {turn + 1} about {topic}."})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


async def two_turns_each(memory) -> dict[str, list[int]]:
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)

    async def turn(topic: str, number: int) -> list[int]:
        text = prompt(memory.tokenizer, topic, number)
        deltas = [d async for d in memory.generate(text, params, f"{topic}-{number}", topic)]
        return [t for d in deltas for t in d.token_ids]

    first = await asyncio.gather(*(turn(topic, 1) for topic in TOPICS))
    second = await asyncio.gather(*(turn(topic, 2) for topic in TOPICS))  # all at once, pool already full
    return {topic: a + b for topic, a, b in zip(TOPICS, first, second, strict=True)}


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_sessions_beyond_the_pool_go_to_disk_and_come_back_exact(tiny_model_dirs, tmp_path, kv_cache_dtype):
    roomy = memory_for(
        tiny_model_dirs["qwen3"], tmp_path / "roomy", blocks=512, kv_cache_dtype=kv_cache_dtype
    )
    try:
        expected = asyncio.run(two_turns_each(roomy))
    finally:
        roomy.shutdown()
    # Each session keeps ~6 blocks after its first turn: six of them overfill a 24-block pool.
    tight = memory_for(tiny_model_dirs["qwen3"], tmp_path / "tight", blocks=24, kv_cache_dtype=kv_cache_dtype)
    try:
        replies = asyncio.run(two_turns_each(tight))
        counters = tight.memory_stats()
    finally:
        tight.shutdown()
    assert replies == expected
    assert counters["offloads"] > 0
