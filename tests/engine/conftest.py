import pytest
from transformers import AutoTokenizer

from engine.testing.oracle import reference_greedy, reference_model
from engine.testing.prompts import chat_prompts


def reference_greedy_batch(model_dir, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = reference_model(model_dir)
    return [
        reference_greedy(model, tokenizer.encode(prompt, add_special_tokens=False), max_new_tokens)
        for prompt in prompts
    ]


@pytest.fixture(scope="session")
def model_dirs(smollm2_dir, tiny_model_dirs):
    return {"smollm2": smollm2_dir, **tiny_model_dirs}


@pytest.fixture(scope="session")
def oracle(model_dirs):
    """Per model: (prompts, transformers' greedy tokens), computed once per test session."""
    cache = {}

    def get(name: str, max_new_tokens: int = 24):
        if (name, max_new_tokens) not in cache:
            tokenizer = AutoTokenizer.from_pretrained(model_dirs[name])
            prompts = chat_prompts(tokenizer)
            cache[name, max_new_tokens] = (
                prompts,
                reference_greedy_batch(model_dirs[name], prompts, max_new_tokens),
            )
        return cache[name, max_new_tokens]

    return get
