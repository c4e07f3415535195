import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.prompts import chat_prompts


def reference_greedy(
    model_dir, prompts: list[str], max_new_tokens: int, dtype=torch.float32
) -> list[list[int]]:
    """transformers' own greedy generation, one unpadded prompt at a time: the oracle."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    outputs = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        generated = model.generate(
            ids, max_new_tokens=max_new_tokens, do_sample=False, attention_mask=torch.ones_like(ids)
        )
        outputs.append(generated[0, ids.shape[1] :].tolist())
    return outputs


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
            cache[name, max_new_tokens] = prompts, reference_greedy(model_dirs[name], prompts, max_new_tokens)
        return cache[name, max_new_tokens]

    return get
