"""The async streaming engine: deltas add up to the offline result, aborts stop, UTF-8 stays whole."""

import asyncio

import pytest

from engine import LLM, SamplingParams
from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.detokenizer import Detokenizer

CHINESE = "你好，世界！我们今天去公园散步吧。"


@pytest.fixture(scope="module")
def async_engine(smollm2_dir):
    engine = AsyncEngine(EngineConfig(model=smollm2_dir, dtype="float32", num_kv_blocks=256))
    yield engine
    engine.shutdown()


async def collect(engine, prompt, params, request_id):
    deltas = [delta async for delta in engine.generate(prompt, params, request_id)]
    return deltas


def test_concurrent_streams_equal_offline_generation(async_engine, smollm2_dir):
    tokenizer = async_engine.tokenizer
    questions = ["What is the capital of France?", "Name a fruit.", "What is 3+4?"]
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in questions
    ]
    params = SamplingParams(temperature=0, max_tokens=20)

    async def run_all():
        return await asyncio.gather(
            *(collect(async_engine, p, params, f"s{i}") for i, p in enumerate(prompts))
        )

    streams = asyncio.run(run_all())
    offline = LLM(str(smollm2_dir), dtype="float32", num_kv_blocks=256).generate(prompts, params)
    for deltas, expected in zip(streams, offline, strict=True):
        assert "".join(d.text for d in deltas) == expected.outputs[0].text
        assert [t for d in deltas for t in d.token_ids] == expected.outputs[0].token_ids
        assert deltas[-1].finish_reason == expected.outputs[0].finish_reason
        assert all(d.finish_reason is None for d in deltas[:-1])
        assert deltas[0].num_prompt_tokens == len(expected.prompt_token_ids)


def test_abort_and_cancel_stop_a_stream(async_engine):
    params = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)

    async def scenario():
        received = []
        async for delta in async_engine.generate("Count to one thousand:", params, "to-abort"):
            received.append(delta)
            if len(received) == 3:
                await async_engine.abort("to-abort")
        with pytest.raises(ValueError, match="unknown request id"):
            await async_engine.abort("to-abort")
        stream = async_engine.generate("Count again:", params, "to-cancel")
        await stream.__anext__()
        await stream.aclose()  # a client that walks away
        for _ in range(100):
            if async_engine.stats().num_running == 0:
                break
            await asyncio.sleep(0.05)
        return received

    received = asyncio.run(scenario())
    assert received[-1].finish_reason == "abort" and len(received) < 10
    assert async_engine.stats().num_running == 0 and async_engine.stats().num_waiting == 0


def test_bad_request_raises_before_streaming_and_engine_keeps_serving(async_engine):
    async def scenario():
        with pytest.raises(ValueError, match="prompt is empty"):
            await collect(async_engine, "", SamplingParams(), "empty")
        return await collect(async_engine, "Hello", SamplingParams(temperature=0, max_tokens=3), "after")

    assert len(asyncio.run(scenario())) == 3
    assert async_engine.is_healthy()


def test_multibyte_text_streams_without_broken_characters(async_engine):
    tokenizer = async_engine.tokenizer
    token_ids = tokenizer.encode(CHINESE + " 😀 ok", add_special_tokens=False)
    detokenizer = Detokenizer(tokenizer, tokenizer.encode("Say:", add_special_tokens=False), SamplingParams())
    pieces = []
    for token_id in token_ids:
        detokenizer.add(token_id)
        pieces.append(detokenizer.take_new_text(finished=False))
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) == CHINESE + " 😀 ok"
    assert sum(1 for piece in pieces if piece == "") > 0  # some tokens carried half a character


def test_stop_string_is_never_half_streamed(async_engine):
    tokenizer = async_engine.tokenizer
    text = "The answer is forty-two. END of story"
    detokenizer = Detokenizer(tokenizer, [1], SamplingParams(stop=["END of"]))
    streamed = ""
    for token_id in tokenizer.encode(text, add_special_tokens=False):
        stopped = detokenizer.add(token_id)
        streamed += detokenizer.take_new_text(finished=stopped)
        if stopped:
            break
    assert streamed == "The answer is forty-two. "


def test_callers_cancelled_while_adding_leave_the_engine_healthy(async_engine):
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def scenario():
        tasks = [asyncio.create_task(collect(async_engine, "Hi", params, f"c{i}")) for i in range(8)]
        await asyncio.sleep(0)  # let them start adding, then walk away
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _ in range(100):
            if async_engine.stats().num_running + async_engine.stats().num_waiting == 0:
                break
            await asyncio.sleep(0.05)
        return await collect(
            async_engine, "Hello", SamplingParams(temperature=0, max_tokens=3), "after-cancel"
        )

    assert len(asyncio.run(scenario())) == 3
    assert async_engine.is_healthy()
    assert async_engine.stats().num_running == 0


def test_a_caller_whose_event_loop_closed_does_not_stop_the_engine(async_engine):
    """A stream's loop closes mid-request without closing the stream (a script that ends, a killed
    worker): the engine aborts the orphaned request and goes on serving."""
    params = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)
    orphan_loop = asyncio.new_event_loop()
    stream = async_engine.generate("Count to one thousand:", params, "orphan")
    orphan_loop.run_until_complete(anext(stream))
    orphan_loop.close()  # the stream is never closed, so its request is never aborted by the caller

    after = collect(async_engine, "Name a fruit.", SamplingParams(max_tokens=5), "after")
    deltas = asyncio.run(asyncio.wait_for(after, timeout=60))  # a dead engine would leave it waiting
    assert deltas[-1].finish_reason is not None and async_engine.is_healthy()
    assert async_engine.call_sync(lambda: "orphan" not in async_engine.engine.sequences, timeout=30)


def test_a_model_that_cannot_load_fails_the_constructor_not_a_later_call(tmp_path):
    from engine.model_files import ModelLoadError

    with pytest.raises(ModelLoadError):  # the engine is built on its loop thread; the error comes back here
        AsyncEngine(EngineConfig(model=str(tmp_path), dtype="float32"))
