"""The oracle: transformers' own model and greedy generate, on the device our engine picks by default."""

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from engine.config import resolve_device
from engine.quantization import dequantize_int8, quantize_int8

DEVICE = resolve_device("auto")
# What the engine is checked against the oracle with: as is, int8 weights, the int8 KV cache, speculative
# decoding (which must not change a greedy token).
VARIANTS = {
    "plain": {},
    "int8-weights": {"quantization": "int8"},
    "int8-kv": {"kv_cache_dtype": "int8"},
    "ngram": {"speculative": "ngram"},
}
# Logits: how far the int8 KV cache's rounding alone moves the margin between two tokens. transformers
# itself, given the same SmolLM2 chat tokens (five turns) once in one pass and once token by token,
# stores keys differing in their last bits; a few int8 elements then round the other way, and margins
# move by a median 0.03, a p99 0.13-0.55 (0.1 was too tight: a session turn parted at 0.11).
NEAR_TIE = 0.5


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


class Int8KvCache(DynamicCache):
    """transformers' cache with every key and value rounded as our int8 KV cache stores it (a scale per
    token and KV head), so the oracle holds for `--kv-cache-dtype int8` too."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = (dequantize_int8(*quantize_int8(x)).to(x.dtype) for x in (key_states, value_states))
        return super().update(keys, values, layer_idx, *args, **kwargs)


def reference_greedy(
    model, prompt_ids: list[int], max_new_tokens: int, kv_cache_dtype: str = "auto", **options
) -> list[int]:
    """One unpadded prompt at a time, so no padding can change the oracle's arithmetic."""
    ids = torch.tensor([prompt_ids], device=DEVICE)
    if kv_cache_dtype == "int8":
        options["past_key_values"] = Int8KvCache()
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False, **options
    )
    return out[0, len(prompt_ids) :].tolist()


@torch.no_grad()
def greedy_margins(model, prompt_ids: list[int], tokens: list[int], kv_cache_dtype="auto") -> list[float]:
    """Per generated token, how far its logit was ahead of the runner-up's, in one forward pass."""
    ids = torch.tensor([prompt_ids + tokens[:-1]], device=DEVICE)
    cache = Int8KvCache() if kv_cache_dtype == "int8" else None
    logits = model(ids, past_key_values=cache).logits[0, len(prompt_ids) - 1 :].float()
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def first_divergence_is_a_near_tie(tokens: list[int], expected: list[int], margins: list[float]) -> bool:
    """With an int8 KV cache, key elements rounding to the neighbouring step (our products and
    transformers' differ in the last bits) move logits by up to NEAR_TIE: greedy outputs may part where
    the reference's top two tokens were that close, and nowhere else."""
    for index, (got, want) in enumerate(zip(tokens, expected, strict=False)):
        if got != want:
            return margins[index] < NEAR_TIE
    return len(tokens) == len(expected)
