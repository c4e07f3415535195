"""Caller mistakes get a clear ValueError while the engine keeps serving every other request."""

import pytest

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def engine(tiny_model_dirs):
    return LLMEngine(
        EngineConfig(model=tiny_model_dirs["llama"], dtype="float32", num_kv_blocks=16, max_model_len=128)
    )


def finish(engine):
    tokens = {}
    while engine.has_unfinished_requests():
        for update in engine.step():
            tokens.setdefault(update.seq.request_id, []).extend(update.new_token_ids)
    return tokens


@pytest.mark.parametrize(
    "prompt, params, message",
    [
        ("", SamplingParams(), "prompt is empty"),
        ({"prompt_token_ids": []}, SamplingParams(), "prompt is empty"),
        ({"prompt_token_ids": [1, -4]}, SamplingParams(), "token ids must be integers"),
        ({"prompt_token_ids": [10**9]}, SamplingParams(), "token ids must be integers"),
        ({"text": "hi"}, SamplingParams(), "needs 'prompt_token_ids'"),
        ({"prompt_token_ids": [5] * 128}, SamplingParams(), "context is 128 tokens"),
        ({"prompt_token_ids": [5] * 100}, SamplingParams(max_tokens=27), None),
        ({"prompt_token_ids": [5] * 10}, SamplingParams(max_tokens=1000), None),
    ],
)
def test_bad_requests_fail_alone(engine, prompt, params, message):
    engine.add_request("good", {"prompt_token_ids": [1, 2, 3]}, SamplingParams(temperature=0, max_tokens=5))
    engine.step()
    if message is None:  # fits the context once capped at max_model_len, and the pool (16 x 16 tokens)
        engine.add_request("capped", prompt, params)
    else:
        with pytest.raises(ValueError, match=message):
            engine.add_request("bad", prompt, params)
    tokens = finish(engine)
    assert len(tokens["good"]) == 4  # one token came in the first step
    if message is None:
        assert engine.stats().num_running == 0


def test_a_request_that_can_never_fit_the_pool_is_refused(tiny_model_dirs):
    llm = LLM(str(tiny_model_dirs["llama"]), dtype="float32", num_kv_blocks=4)  # 64 tokens of KV
    with pytest.raises(ValueError, match="pool holds 64"):
        llm.generate({"prompt_token_ids": [5] * 40}, SamplingParams(max_tokens=30))
    assert (
        len(
            llm.generate({"prompt_token_ids": [5] * 40}, SamplingParams(max_tokens=20))[0]
            .outputs[0]
            .token_ids
        )
        == 20
    )


def test_duplicate_and_unknown_request_ids(engine):
    engine.add_request("same", "hello", SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("same", "hello", SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="unknown request id"):
        engine.abort_request("nobody")
    finish(engine)


def test_max_tokens_is_capped_by_the_context(engine):
    engine.add_request("long", {"prompt_token_ids": [5] * 120}, SamplingParams(max_tokens=50))
    tokens = finish(engine)
    assert len(tokens["long"]) == 8


def test_bad_engine_options_are_rejected(tiny_model_dirs):
    for options, message in [
        ({"dtype": "int3"}, "dtype"),
        ({"scheduling_policy": "random"}, "scheduling_policy"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"block_size": 0}, "block_size"),
    ]:
        with pytest.raises(ValueError, match=message):
            LLM(str(tiny_model_dirs["llama"]), **options)
