"""The oracle: our greedy tokens equal transformers' greedy tokens, in every scheduling mode; with int8
weights, transformers' on the same weights dequantized (float32); with the int8 KV cache, transformers'
with each key and value rounded the same way (engine/testing/oracle.py)."""

import pytest

from engine import LLM, SamplingParams
from engine.testing.oracle import VARIANTS

MODELS = ["smollm2", "llama", "qwen2", "qwen3"]
MAX_NEW = 24
pytestmark = pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())


def greedy(max_tokens=MAX_NEW):
    return SamplingParams(temperature=0, max_tokens=max_tokens)


def run(model_dir, prompts, variant, **options):
    llm = LLM(str(model_dir), dtype="float32", **variant, **options)
    outputs = llm.generate(prompts, greedy())
    return llm, [output.outputs[0].token_ids for output in outputs]


@pytest.mark.parametrize("model", MODELS)
def test_batch_of_prompts_equals_transformers(model_dirs, oracle, model, variant):
    prompts, _ = oracle(model, MAX_NEW, **variant)
    _, tokens = run(model_dirs[model], prompts, variant, num_kv_blocks=512)
    oracle.assert_matches(model, tokens, variant, MAX_NEW)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("budget", [1, 4, 16])
def test_chunked_prefill_equals_transformers(model_dirs, oracle, model, budget, variant):
    prompts, _ = oracle(model, MAX_NEW, **variant)
    if model == "smollm2":  # few tokens per step are slow with real weights: fewer (still mixed) prompts
        count = 2 if budget == 1 else 4
        prompts = prompts[:count]
    _, tokens = run(model_dirs[model], prompts, variant, num_kv_blocks=512, max_num_batched_tokens=budget)
    oracle.assert_matches(model, tokens, variant, MAX_NEW)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prefix_caching_hits_and_equals_transformers(model_dirs, oracle, model, prefix_caching, variant):
    prompts, _ = oracle(model, MAX_NEW, **variant)
    llm = LLM(
        str(model_dirs[model]),
        dtype="float32",
        **variant,
        num_kv_blocks=512,
        enable_prefix_caching=prefix_caching,
    )
    first = llm.generate(prompts[:1], greedy())  # its system prompt is shared by every even prompt
    rest = llm.generate(prompts[1:], greedy())
    oracle.assert_matches(model, [o.outputs[0].token_ids for o in first + rest], variant, MAX_NEW)
    cached = [o.num_cached_tokens for o in rest]
    stats = llm.engine.stats()
    if prefix_caching:
        assert all(cached[i] >= 32 for i in range(1, len(rest), 2)), cached  # even prompts, shifted by one
        assert stats.prefix_cache_hits == sum(cached) > 0
    else:
        assert stats.prefix_cache_hits == 0 and sum(cached) == 0


@pytest.mark.parametrize("model", MODELS)
def test_preemption_under_a_tiny_kv_pool_equals_transformers(model_dirs, oracle, model, variant):
    prompts, _ = oracle(model, MAX_NEW, **variant)
    # Each request needs 5-8 blocks of 16 tokens; 24 blocks cannot hold all ten at once.
    llm, tokens = run(model_dirs[model], prompts, variant, num_kv_blocks=24)
    assert llm.engine.stats().num_preemptions > 0
    oracle.assert_matches(model, tokens, variant, MAX_NEW)


@pytest.mark.parametrize("model", ["smollm2", "qwen3"])
def test_requests_joining_mid_decode_match_running_alone(model_dirs, oracle, model, variant):
    prompts, _ = oracle(model, MAX_NEW, **variant)
    llm = LLM(str(model_dirs[model]), dtype="float32", num_kv_blocks=512, **variant)
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
    oracle.assert_matches(model, [tokens[i] for i in range(len(prompts))], variant, MAX_NEW)
