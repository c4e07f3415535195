"""The oracle: transformers' own model and greedy generate, on the device our engine picks by default."""

import torch
from transformers import AutoModelForCausalLM

from engine.config import resolve_device
from engine.quantization import dequantize_int8, quantize_int8

DEVICE = resolve_device("auto")


def reference_model(model_dir, dtype=torch.float32, quantization: str | None = None):
    """With quantization "int8", the linear layers' weights are what our int8 layers compute with
    (quantized and dequantized again), so the oracle holds for our int8 engine too; a tied lm_head gets
    its own copy, as ours does, and the embeddings keep theirs."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(DEVICE)
    if quantization == "int8":
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                weight = dequantize_int8(*quantize_int8(module.weight.detach())).to(module.weight.dtype)
                module.weight = torch.nn.Parameter(weight, requires_grad=False)
    return model


def reference_greedy(model, prompt_ids: list[int], max_new_tokens: int, **options) -> list[int]:
    """One unpadded prompt at a time, so no padding can change the oracle's arithmetic."""
    ids = torch.tensor([prompt_ids], device=DEVICE)
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False, **options
    )
    return out[0, len(prompt_ids) :].tolist()
