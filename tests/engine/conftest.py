import pytest
from transformers import AutoTokenizer

from engine.testing.oracle import reference_greedy, reference_model
from engine.testing.prompts import chat_prompts


def reference_greedy_batch(
    model_dir, prompts: list[str], max_new_tokens: int, quantization: str | None = None
) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = reference_model(model_dir, quantization=quantization)
    return [
        reference_greedy(model, tokenizer.encode(prompt, add_special_tokens=False), max_new_tokens)
        for prompt in prompts
    ]


@pytest.fixture(scope="session")
def model_dirs(smollm2_dir, tiny_model_dirs):
    return {"smollm2": smollm2_dir, **tiny_model_dirs}


@pytest.fixture(scope="session")
def oracle(model_dirs):
    """Per model and quantization: (prompts, transformers' greedy tokens), computed once a session."""
    cache = {}

    def get(name: str, max_new_tokens: int = 24, quantization: str | None = None):
        key = name, max_new_tokens, quantization
        if key not in cache:
            tokenizer = AutoTokenizer.from_pretrained(model_dirs[name])
            prompts = chat_prompts(tokenizer)
            cache[key] = (
                prompts,
                reference_greedy_batch(model_dirs[name], prompts, max_new_tokens, quantization),
            )
        return cache[key]

    return get
