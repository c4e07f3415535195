"""The oracle: our greedy tokens equal transformers' greedy tokens, in every scheduling mode; with int8
weights, transformers' on the same weights dequantized (float32)."""

import pytest

from engine import LLM, SamplingParams

MODELS = ["smollm2", "llama", "qwen2", "qwen3"]
MAX_NEW = 24
pytestmark = pytest.mark.parametrize("quantization", [None, "int8"])


def greedy(max_tokens=MAX_NEW):
    return SamplingParams(temperature=0, max_tokens=max_tokens)


def run(model_dir, prompts, quantization, **options):
    llm = LLM(str(model_dir), dtype="float32", quantization=quantization, **options)
    outputs = llm.generate(prompts, greedy())
    return llm, [output.outputs[0].token_ids for output in outputs]


@pytest.mark.parametrize("model", MODELS)
def test_batch_of_prompts_equals_transformers(model_dirs, oracle, model, quantization):
    prompts, expected = oracle(model, MAX_NEW, quantization)
    _, tokens = run(model_dirs[model], prompts, quantization, num_kv_blocks=512)
    assert tokens == expected


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("budget", [1, 4, 16])
def test_chunked_prefill_equals_transformers(model_dirs, oracle, model, budget, quantization):
    prompts, expected = oracle(model, MAX_NEW, quantization)
    if model == "smollm2":  # few tokens per step are slow with real weights: fewer (still mixed) prompts
        count = 2 if budget == 1 else 4
        prompts, expected = prompts[:count], expected[:count]
    _, tokens = run(
        model_dirs[model], prompts, quantization, num_kv_blocks=512, max_num_batched_tokens=budget
    )
    assert tokens == expected


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prefix_caching_hits_and_equals_transformers(model_dirs, oracle, model, prefix_caching, quantization):
    prompts, expected = oracle(model, MAX_NEW, quantization)
    llm = LLM(
        str(model_dirs[model]),
        dtype="float32",
        quantization=quantization,
        num_kv_blocks=512,
        enable_prefix_caching=prefix_caching,
    )
    first = llm.generate(prompts[:1], greedy())  # its system prompt is shared by every even prompt
    rest = llm.generate(prompts[1:], greedy())
    assert [o.outputs[0].token_ids for o in first + rest] == expected
    cached = [o.num_cached_tokens for o in rest]
    stats = llm.engine.stats()
    if prefix_caching:
        assert all(cached[i] >= 32 for i in range(1, len(rest), 2)), cached  # even prompts, shifted by one
        assert stats.prefix_cache_hits == sum(cached) > 0
    else:
        assert stats.prefix_cache_hits == 0 and sum(cached) == 0


@pytest.mark.parametrize("model", MODELS)
def test_preemption_under_a_tiny_kv_pool_equals_transformers(model_dirs, oracle, model, quantization):
    prompts, expected = oracle(model, MAX_NEW, quantization)
    # Each request needs 5-8 blocks of 16 tokens; 24 blocks cannot hold all ten at once.
    llm, tokens = run(model_dirs[model], prompts, quantization, num_kv_blocks=24)
    assert llm.engine.stats().num_preemptions > 0
    assert tokens == expected


@pytest.mark.parametrize("model", ["smollm2", "qwen3"])
def test_requests_joining_mid_decode_match_running_alone(model_dirs, oracle, model, quantization):
    prompts, expected = oracle(model, MAX_NEW, quantization)
    llm = LLM(str(model_dirs[model]), dtype="float32", quantization=quantization, num_kv_blocks=512)
    engine = llm.engine
    tokens = {}
    pending = list(enumerate(prompts))
    step = 0
    while pending or engine.has_unfinished_requests():
        if pending and step % 3 == 0:  # a new request every third step, while others decode
            index, prompt = pending.pop(0)
            engine.add_request(str(index), prompt, greedy())
        for update in engine.step():
            tokens.setdefault(int(update.seq.request_id), []).extend(update.new_token_ids)
        step += 1
    assert [tokens[i] for i in range(len(prompts))] == expected
