"""Speculative decoding by prompt lookup: drafts are found where the text repeats, greedy output is
transformers' token for token whether drafts are accepted or all rejected, sampled output keeps its
distribution, and stops and max_tokens cut where they cut without speculation.  The oracle tests run
every scheduling mode with speculation too (engine/testing/oracle.py: VARIANTS)."""

from collections import Counter

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.kernels import cpu_kernels
from engine.layers.linear import Linear
from engine.llm_engine import LLMEngine
from engine.speculative import MAX_STEP_ROWS, DraftState, NgramDrafter, longest_match_end
from engine.testing.oracle import reference_greedy, reference_model
from engine.testing.recording import record_logits, run_to_end

REPEAT = (
    "Repeat this text exactly: The order number is A-7731-Q and the product is the Nordic Steel Kettle, "
    "1.7 litres. Returns are accepted within 30 days of delivery when the item is unused and in its "
    "original packaging."
)


def test_lookup_continues_the_latest_of_the_longest_earlier_matches():
    #                   0  1  2  3  4  5  6  7  8  9 10 11 12
    text = np.array([1, 2, 3, 9, 5, 2, 3, 7, 8, 4, 1, 2, 3])
    assert longest_match_end(text, 2, 4) == 3  # "1 2 3" beats the later "2 3"
    assert longest_match_end(text[:-3], 1, 4) is None  # the last token, 4, never came before
    assert longest_match_end(np.array([5, 2, 3, 7, 6, 2, 3, 8, 4, 2, 3]), 2, 4) == 7  # the latest "2 3"
    assert longest_match_end(np.array([1, 2, 5, 2, 6, 2]), 2, 4) is None  # only one token matches
    assert longest_match_end(np.array([1, 2, 5, 2, 6, 2]), 1, 4) == 4
    # a token seen once before anchors a draft by itself
    assert longest_match_end(np.array([1, 2, 5, 2]), 2, 4) == 2
    assert longest_match_end(np.array([5, 2]), 2, 4) is None
    assert longest_match_end(np.array([2, 2]), 3, 4) == 1  # however short the text


def test_drafts_stop_at_the_limit_and_pause_longer_after_each_poor_draft_but_the_first():
    drafter = NgramDrafter(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=2)
    state = DraftState.of_prompt([1, 2, 3, 4, 5, 1, 2])
    assert drafter.propose(state, limit=10) == [3, 4, 5]
    assert drafter.propose(state, limit=2) == [3, 4]
    assert drafter.propose(state, limit=0) == []
    pattern = []
    for _ in range(4):
        state.record(drafted=3, accepted=0)
        pattern.append([bool(drafter.propose(state, limit=3)) for _ in range(5)])
    assert pattern == [
        [True] * 5,
        [False, True, True, True, True],
        [False, False, True, True, True],
        [False] * 4 + [True],
    ]
    state.record(drafted=3, accepted=3)
    assert drafter.propose(state, limit=3) and state.poor_in_a_row == 0
    state.sync([6, 1])  # the reply so far extends the text: "6 1" then looks back to "5 1 2 ..."
    assert state.length == 9 and drafter.propose(state, limit=3) == [2, 6, 1]


@pytest.fixture(scope="module")
def repeat_prompt(smollm2_dir):
    llm = LLM(str(smollm2_dir), dtype="float32", num_kv_blocks=64)
    messages = [{"role": "user", "content": REPEAT}]
    return llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def engine_for(model_dir, **options) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model=str(model_dir), **{"dtype": "float32", "num_kv_blocks": 128, **options})
    )


def run_steps(engine: LLMEngine, prompt: str, params: SamplingParams) -> tuple[list[int], int]:
    """(tokens, steps taken) of one request"""
    tokens, steps = run_to_end(engine, {"r": prompt}, params)
    return tokens["r"], steps


def test_a_reply_that_repeats_its_prompt_accepts_most_drafts_and_equals_transformers(
    smollm2_dir, repeat_prompt
):
    engine = engine_for(smollm2_dir, speculative="ngram")
    tokens, steps = run_steps(engine, repeat_prompt, SamplingParams(temperature=0, max_tokens=48))
    ids = engine.tokenizer.encode(repeat_prompt, add_special_tokens=False)
    assert tokens == reference_greedy(reference_model(smollm2_dir), ids, 48)
    stats = engine.stats()
    assert stats.spec_accepted_tokens >= 0.6 * stats.spec_draft_tokens > 0  # a draft's tail fails more often
    assert steps < len(tokens) / 2  # prefill included


def test_a_drafted_step_computes_each_row_to_the_bits_of_the_step_without_drafts(smollm2_dir, repeat_prompt):
    """Products choose their kernel by the step's rows without its drafts: here one row takes our
    kernel and any more torch's product, so a verify step of five rows would otherwise round apart."""
    logits = {}
    for speculative in None, "ngram":
        engine = engine_for(smollm2_dir, speculative=speculative)
        model = engine.runner.model
        for module in model.modules():
            if isinstance(module, Linear):
                module.max_kernel_rows = 1
        model.decode_layers = model.kernel_decode_layers(cpu_kernels())
        logits[speculative] = record_logits(engine)
        run_steps(engine, repeat_prompt, SamplingParams(temperature=0, max_tokens=40))
    assert engine.stats().spec_accepted_tokens > 20
    assert logits["ngram"].keys() == logits[None].keys()
    assert all(torch.equal(logits["ngram"][p], logits[None][p]) for p in logits[None])


class AlwaysWrong(NgramDrafter):
    """Drafts a token the model never picks here, so every draft is rejected."""

    def lookup(self, state: DraftState, limit: int) -> list[int]:
        return [0] * limit


def test_rejected_drafts_change_nothing_and_drafting_backs_off(smollm2_dir, repeat_prompt):
    engine = engine_for(smollm2_dir, speculative="ngram")
    engine.scheduler.drafter = AlwaysWrong(4, 2, 4)
    tokens, steps = run_steps(engine, repeat_prompt, SamplingParams(temperature=0, max_tokens=40))
    ids = engine.tokenizer.encode(repeat_prompt, add_special_tokens=False)
    assert tokens == reference_greedy(reference_model(smollm2_dir), ids, 40)
    stats = engine.stats()
    # at once, then after 0, 1, 2, 4, 8, 16 steps
    assert stats.spec_accepted_tokens == 0 and 0 < stats.spec_num_drafts <= 8
    assert steps == len(tokens)  # one token a step, as without speculation


def test_drafts_fill_a_step_only_up_to_its_row_limit_best_acceptance_first(smollm2_dir, repeat_prompt):
    engine = engine_for(smollm2_dir, speculative="ngram", num_kv_blocks=1024)
    steps, run = [], engine.runner.run

    def recorded(batch):
        steps.append([(item.num_new_tokens, len(item.draft_token_ids)) for item in batch])
        return run(batch)

    engine.runner.run = recorded
    for i in range(40):  # more than a step drafts for, finishing one after another
        engine.add_request(str(i), repeat_prompt, SamplingParams(temperature=0, max_tokens=4 + i))
    while engine.has_unfinished_requests():
        engine.step()
    drafted = [step for step in steps if any(drafts for _, drafts in step)]
    assert drafted and all(sum(own + drafts for own, drafts in step) <= MAX_STEP_ROWS for step in drafted)
    assert all(len(step) <= MAX_STEP_ROWS for step in drafted)


def step_rows(engine: LLMEngine, prompt: str, requests: int) -> list[int]:
    """Rows (tokens and drafts) of every step of `requests` greedy copies of the prompt run at once."""
    steps, run = [], engine.runner.run

    def recorded(batch):
        steps.append(sum(item.num_input_tokens for item in batch))
        return run(batch)

    engine.runner.run = recorded
    for i in range(requests):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0, max_tokens=24))
    while engine.has_unfinished_requests():
        engine.step()
    return steps


def test_drafts_past_the_cheap_rows_of_a_step_only_where_they_are_usually_accepted(
    smollm2_dir, repeat_prompt
):
    # As if one pass of the products over the weights served 4 rows (8 on AVX-512 BF16, 32 on AMX).
    rejected = engine_for(smollm2_dir, speculative="ngram", num_kv_blocks=256)
    rejected.scheduler.cheap_step_rows = 4
    rejected.scheduler.drafter = AlwaysWrong(6, 2, 4)
    rows = step_rows(rejected, repeat_prompt, 2)
    # After the prefill, one step where each sequence's first draft shows how it fares, then 4 rows at most.
    assert rejected.stats().spec_draft_tokens > 0 and max(rows[2:]) <= 4
    accepted = engine_for(smollm2_dir, speculative="ngram", num_kv_blocks=256)
    accepted.scheduler.cheap_step_rows = 4
    rows = step_rows(accepted, repeat_prompt, 2)
    assert max(rows[1:]) > 4 and accepted.stats().spec_accepted_tokens > 10


def test_a_step_holds_one_pass_of_the_packed_products_for_about_the_cost_of_one_row(smollm2_dir):
    engine = engine_for(smollm2_dir, dtype="bfloat16", speculative="ngram")
    packed = cpu_kernels() is not None and cpu_kernels().packed_linear_available()
    expected = min(cpu_kernels().packed_linear_rows_per_pass(576), MAX_STEP_ROWS) if packed else MAX_STEP_ROWS
    assert engine.scheduler.cheap_step_rows == expected


@pytest.mark.parametrize("max_tokens", [2, 5, 9, 14])
def test_max_tokens_inside_an_accepted_draft_cuts_where_it_cuts_without_speculation(
    smollm2_dir, repeat_prompt, max_tokens
):
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    outputs = [
        LLM(str(smollm2_dir), dtype="float32", num_kv_blocks=64, speculative=spec).generate(
            repeat_prompt, params
        )
        for spec in (None, "ngram")
    ]
    plain, speculative = (o[0].outputs[0] for o in outputs)
    assert speculative.token_ids == plain.token_ids and len(plain.token_ids) == max_tokens
    assert speculative.finish_reason == plain.finish_reason == "length"


@pytest.mark.parametrize("stop", ["Kettle", "30 days", "A-77"])
def test_a_stop_string_inside_an_accepted_draft_cuts_where_it_cuts_without_speculation(
    smollm2_dir, repeat_prompt, stop
):
    params = SamplingParams(temperature=0, max_tokens=64, stop=[stop])
    llms = [LLM(str(smollm2_dir), dtype="float32", num_kv_blocks=64, speculative=s) for s in (None, "ngram")]
    plain, speculative = (llm.generate(repeat_prompt, params)[0].outputs[0] for llm in llms)
    assert plain.finish_reason == "stop" and stop not in plain.text
    assert (speculative.text, speculative.token_ids, speculative.finish_reason) == (
        plain.text,
        plain.token_ids,
        plain.finish_reason,
    )
    assert llms[1].engine.stats().spec_accepted_tokens > 0


class GreedyContinuation(NgramDrafter):
    """Drafts what greedy decoding would say next: likely tokens, so that both accepted and rejected
    drafts are frequent (prompt lookup would rarely match a tiny random model's choices)."""

    def __init__(self, greedy_tokens: list[int]):
        super().__init__(4, 1, 1)
        self.greedy_tokens = greedy_tokens

    def lookup(self, state: DraftState, limit: int) -> list[int]:
        done = state.length - state.prompt_length
        return self.greedy_tokens[done : done + limit]


def sampled_replies(llm: LLM, prompt: dict, seeds: range) -> Counter:
    params = [SamplingParams(temperature=1.0, top_k=2, max_tokens=4, seed=s, ignore_eos=True) for s in seeds]
    return Counter(tuple(o.outputs[0].token_ids) for o in llm.generate([prompt] * len(seeds), params))


def test_sampled_output_keeps_its_distribution_with_speculation(tiny_model_dirs):
    """Rejection sampling leaves the distribution of what is sampled unchanged: 4-token replies (16
    possible with top-k 2) over 1,000 seeds with and 1,000 other seeds without speculation are within a
    total variation distance of 0.1.  Measured here: two runs without speculation differ by about 0.05;
    accepting every draft gives 0.78, and sampling a rejected position from p instead of p without the
    draft 0.15."""
    options = {"dtype": "float32", "num_kv_blocks": 1024, "max_num_seqs": 256, "max_num_batched_tokens": 4096}
    plain = LLM(str(tiny_model_dirs["qwen3"]), **options)
    prompt = {"prompt_token_ids": [17, 4012, 921, 33, 7810, 220, 5012]}
    greedy = plain.generate(prompt, SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].token_ids
    # Six at a time: with their drafts they stay within the rows a step drafts for (MAX_STEP_ROWS).
    speculative = LLM(str(tiny_model_dirs["qwen3"]), speculative="ngram", **{**options, "max_num_seqs": 6})
    speculative.engine.scheduler.drafter = GreedyContinuation(greedy)
    samples = 1000
    expected = sampled_replies(plain, prompt, range(samples))
    got = sampled_replies(speculative, prompt, range(samples, 2 * samples))
    stats = speculative.engine.stats()
    assert 0.1 * stats.spec_draft_tokens < stats.spec_accepted_tokens < 0.8 * stats.spec_draft_tokens
    assert stats.spec_num_drafts > 0.8 * samples
    distance = sum(abs(expected[k] - got[k]) for k in expected.keys() | got.keys()) / (2 * samples)
    assert distance < 0.1, (distance, expected, got)


def test_a_seed_reproduces_a_sample_with_speculation(smollm2_dir, repeat_prompt):
    llm = LLM(str(smollm2_dir), dtype="float32", num_kv_blocks=64, speculative="ngram")
    params = SamplingParams(temperature=0.8, max_tokens=24, seed=11)
    first, again = (llm.generate(repeat_prompt, params)[0].outputs[0].token_ids for _ in range(2))
    assert first == again
