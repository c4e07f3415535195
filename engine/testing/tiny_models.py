"""Tiny random models of each supported family, saved as real Hugging Face folders."""

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config, Qwen3Config

TINY_CONFIGS = {
    "llama": lambda vocab: LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        initializer_range=0.2,
    ),
    "qwen2": lambda vocab: Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.2,
    ),
    "qwen3": lambda vocab: Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.2,
    ),
}


def build_tiny_model(family: str, tokenizer_dir: Path, target: Path, seed: int = 0) -> Path:
    """A random model that shares the real tokenizer and chat template of `tokenizer_dir`."""
    return build_model(TINY_CONFIGS[family], tokenizer_dir, target, seed)


def build_model(make_config, tokenizer_dir: Path, target: Path, seed: int = 0) -> Path:
    """A random model of make_config(vocabulary size) with the tokenizer of `tokenizer_dir`."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = make_config(len(tokenizer))
    config.bos_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # transformers starts biases at zero, where a bias the engine dropped would hide
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(std=config.initializer_range)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
