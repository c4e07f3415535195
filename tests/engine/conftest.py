import pytest
from transformers import AutoTokenizer

from engine.testing.oracle import (
    first_divergence_is_a_near_tie,
    greedy_margins,
    reference_greedy,
    reference_model,
)
from engine.testing.prompts import chat_prompts


def reference_greedy_batch(
    model_dir, prompts: list[str], max_new_tokens: int, quantization: str | None, kv_cache_dtype: str
) -> tuple[list[list[int]], list[list[float]]]:
    """transformers' greedy tokens of each prompt, and the margin of each token over the runner-up."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = reference_model(model_dir, quantization=quantization)
    tokens, margins = [], []
    for prompt in prompts:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        tokens.append(reference_greedy(model, ids, max_new_tokens, kv_cache_dtype))
        margins.append(greedy_margins(model, ids, tokens[-1], kv_cache_dtype))
    return tokens, margins


@pytest.fixture(scope="session")
def model_dirs(smollm2_dir, tiny_model_dirs):
    return {"smollm2": smollm2_dir, **tiny_model_dirs}


class Oracle:
    """Per model, weight quantization and KV cache dtype: prompts, transformers' greedy tokens and their
    margins, computed once a session."""

    def __init__(self, model_dirs):
        self.model_dirs = model_dirs
        self.cache = {}

    def __call__(self, name, max_new_tokens=24, quantization=None, kv_cache_dtype="auto", speculative=None):
        """(prompts, greedy tokens of each); speculation changes nothing in them."""
        prompts, tokens, _ = self.get(name, max_new_tokens, quantization, kv_cache_dtype)
        return prompts, tokens

    def assert_matches(self, name, tokens: list[list[int]], variant: dict, max_new_tokens=24) -> None:
        """Our tokens for the first len(tokens) prompts equal transformers' token for token; with the
        int8 KV cache, up to a first divergence at a near tie (first_divergence_is_a_near_tie)."""
        _, expected, margins = self.get(
            name, max_new_tokens, variant.get("quantization"), variant.get("kv_cache_dtype", "auto")
        )
        expected, margins = expected[: len(tokens)], margins[: len(tokens)]
        if variant.get("kv_cache_dtype") != "int8":
            assert tokens == expected
            return
        for got, want, margin in zip(tokens, expected, margins, strict=True):
            assert first_divergence_is_a_near_tie(got, want, margin), (got, want, margin)

    def get(self, name, max_new_tokens, quantization=None, kv_cache_dtype="auto"):
        key = name, max_new_tokens, quantization, kv_cache_dtype
        if key not in self.cache:
            prompts = chat_prompts(AutoTokenizer.from_pretrained(self.model_dirs[name]))
            self.cache[key] = (
                prompts,
                *reference_greedy_batch(
                    self.model_dirs[name], prompts, max_new_tokens, quantization, kv_cache_dtype
                ),
            )
        return self.cache[key]


@pytest.fixture(scope="session")
def oracle(model_dirs):
    return Oracle(model_dirs)
