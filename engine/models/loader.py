"""Build a CausalLM from a Hugging Face folder and load its safetensors weights into our fused layout."""

from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig

from engine.layers.rotary import STATIC_ROPE_TYPES
from engine.model_files import ModelLoadError, check_model_dir, weight_files
from engine.models.decoder import CausalLM

# Checkpoint projections that we store fused: name -> (fused parameter, index of its part).
FUSED_PARTS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def load_hf_config(folder: str | Path):
    check_model_dir(folder)
    config = AutoConfig.from_pretrained(folder)
    rope_type = config.rope_parameters["rope_type"]
    if rope_type not in STATIC_ROPE_TYPES:
        raise ModelLoadError(f"RoPE scaling {rope_type!r} is not supported (supported: {STATIC_ROPE_TYPES})")
    if getattr(config, "mlp_bias", False):
        raise ModelLoadError("Llama models with mlp_bias are not supported")
    return config


def load_model(
    folder: str | Path,
    config,
    dtype: torch.dtype,
    device: torch.device,
    max_len: int,
    quantization: str | None = None,
) -> CausalLM:
    with torch.device("meta"):
        model = CausalLM(config, max_len)
    model.to_empty(device=device)
    model.rotary.reset()
    load_weights(model, Path(folder), device)
    if model.shape.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    if quantization == "int8":  # from the checkpoint's values, before rounding to the compute dtype
        model.quantize_int8_()
    return model.to(dtype).eval()


def load_weights(model: CausalLM, folder: Path, device: torch.device) -> None:
    params = dict(model.named_parameters())
    missing = {name for name in params if not (model.shape.tie_word_embeddings and name == "lm_head.weight")}
    for file in weight_files(folder):
        with safe_open(file, framework="pt", device=str(device)) as tensors:
            for name in tensors.keys():  # noqa: SIM118 - safe_open objects are not iterable
                target = target_of(name.removeprefix("model."), model)
                if target is None or target[0] not in params:
                    continue
                param_name, part = target
                fused_slice(params[param_name], part, model).copy_(tensors.get_tensor(name))
                missing.discard(param_name)
    if missing:
        raise ModelLoadError(f"model folder {folder} lacks weights for: {', '.join(sorted(missing)[:5])}")


def target_of(name: str, model: CausalLM) -> tuple[str, tuple[str, int] | None] | None:
    """Our parameter name for a checkpoint tensor name, with the fused part it fills (if any)."""
    if name == "lm_head.weight" and model.shape.tie_word_embeddings:
        return None
    pieces = name.split(".")
    for index, piece in enumerate(pieces):
        if piece in FUSED_PARTS:
            fused, part = FUSED_PARTS[piece]
            pieces[index] = fused
            return ".".join(pieces), (piece, part)
    return name, None


def fused_slice(param: torch.Tensor, part: tuple[str, int] | None, model: CausalLM) -> torch.Tensor:
    if part is None:
        return param.data
    shape = model.shape
    piece, index = part
    if piece in ("q_proj", "k_proj", "v_proj"):
        sizes = [shape.num_heads * shape.head_dim] + [shape.num_kv_heads * shape.head_dim] * 2
    else:
        sizes = [shape.intermediate_size] * 2
    return param.data.narrow(0, sum(sizes[:index]), sizes[index])
