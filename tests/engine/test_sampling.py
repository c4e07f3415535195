"""Sampling options: greedy with repetition penalty against transformers, seeds, top-k/top-p, stops."""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.sampler import argmax, sample
from engine.sequence import Sequence
from engine.testing.oracle import reference_greedy, reference_model


@pytest.fixture(scope="module")
def llm(smollm2_dir):
    return LLM(str(smollm2_dir), dtype="float32", num_kv_blocks=256)


@pytest.fixture(scope="module")
def prompt(llm):
    messages = [{"role": "user", "content": "Write a short poem about autumn leaves."}]
    return llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


@pytest.fixture(scope="module")
def france(llm):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    return llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_repetition_penalty_matches_transformers(llm, prompt, smollm2_dir):
    ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
    expected = reference_greedy(reference_model(smollm2_dir), ids, 20, repetition_penalty=1.3)
    output = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20, repetition_penalty=1.3))
    assert output[0].outputs[0].token_ids == expected


def test_a_seed_reproduces_a_sample_and_different_seeds_differ(llm, prompt):
    def sampled(seed):
        params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=16, seed=seed, ignore_eos=True)
        return llm.generate([prompt, prompt], params)  # batched: the seed fixes each row alone

    first, again, other = sampled(7), sampled(7), sampled(8)
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in again]
    assert first[0].outputs[0].token_ids == first[1].outputs[0].token_ids
    assert first[0].outputs[0].token_ids != other[0].outputs[0].token_ids


def test_top_k_one_is_greedy(llm, prompt):
    greedy = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].token_ids
    top1 = (
        llm.generate(prompt, SamplingParams(temperature=1.5, top_k=1, max_tokens=12))[0].outputs[0].token_ids
    )
    assert top1 == greedy


def test_tiny_top_p_is_greedy(llm, prompt):
    greedy = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].token_ids
    sampled = llm.generate(prompt, SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=12))
    assert sampled[0].outputs[0].token_ids == greedy


def test_max_tokens_and_ignore_eos_keep_generating_past_eos(llm, france):
    prompt = france
    # The tokenizer's and the generation config's end tokens both end a reply (they differ in some
    # transformers versions' conversions of the same GGUF).
    eos = llm.engine.eos_token_ids
    normal = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]
    assert normal.finish_reason == "stop" and normal.token_ids[-1] in eos
    forced = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0].outputs[0]
    assert forced.finish_reason == "length" and len(forced.token_ids) == 40
    assert eos & set(forced.token_ids)


def test_stop_strings_cut_the_text_and_stop_token_ids_stop(llm, france):
    prompt = france
    full = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=30))[0].outputs[0]
    assert "Paris" in full.text
    cut = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=30, stop=["Paris"]))[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.index("Paris")]
    stop_id = full.token_ids[2]
    by_id = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_id]))
    assert by_id[0].outputs[0].token_ids == full.token_ids[:3]
    assert by_id[0].outputs[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
    ],
)
def test_invalid_sampling_values_are_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**options)


def test_the_fast_argmax_picks_the_first_of_equal_maxima_as_torch_argmax_does():
    logits = torch.randn(6, 1000, generator=torch.Generator().manual_seed(0))
    logits[1, [7, 500]] = 50.0
    logits[2] = 1.0
    logits[3, 900] = float("nan")  # torch's argmax and max both take a NaN as the maximum
    assert torch.equal(argmax(logits), logits.argmax(dim=-1))
    assert argmax(logits)[1] == 7 and argmax(logits)[2] == 0 and argmax(logits)[3] == 900
    assert argmax(logits[1]).shape == () and argmax(logits[1]) == 7  # one row, as a draft's draw takes it


def test_logits_in_bf16_give_the_argmax_as_they_are_and_are_widened_to_sample():
    """The model's logits come in the compute dtype: greedy rows take their argmax as they are (a bf16
    value widens exactly, so it is float32's argmax), sampled and penalised rows a float32 copy."""
    logits = torch.randn(5, 1000, generator=torch.Generator().manual_seed(0)).bfloat16()
    logits[1, [3, 600]] = 40.0  # equal maxima: the first

    def seqs(*params):  # each with its row's maximum as its one token
        return [Sequence(str(i), [int(logits[i].float().argmax())], p) for i, p in enumerate(params)]

    greedy = seqs(*[SamplingParams(temperature=0)] * 5)
    assert sample(logits, greedy, torch.Generator()) == logits.float().argmax(dim=-1).tolist()
    mixed = seqs(
        SamplingParams(temperature=0),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=0, repetition_penalty=9.0),
        SamplingParams(temperature=0),
    )
    expected = sample(logits.float(), mixed, torch.Generator().manual_seed(5))
    assert sample(logits, mixed, torch.Generator().manual_seed(5)) == expected
    assert expected[3] != int(logits[3].float().argmax())  # the penalty moved row 3 off its maximum
