"""The oracle: transformers' own model and greedy generate, on the device our engine picks by default."""

import torch
from transformers import AutoModelForCausalLM

from engine.config import resolve_device

DEVICE = resolve_device("auto")


def reference_model(model_dir, dtype=torch.float32):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(DEVICE)


def reference_greedy(model, prompt_ids: list[int], max_new_tokens: int, **options) -> list[int]:
    """One unpadded prompt at a time, so no padding can change the oracle's arithmetic."""
    ids = torch.tensor([prompt_ids], device=DEVICE)
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False, **options
    )
    return out[0, len(prompt_ids) :].tolist()
