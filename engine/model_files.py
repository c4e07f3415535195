"""Find and validate a Hugging Face model folder before anything heavy is loaded."""

import json
from pathlib import Path

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


class ModelLoadError(ValueError):
    """A model folder that cannot be served; the message says what is wrong."""


def supported_names() -> str:
    return ", ".join(SUPPORTED_ARCHITECTURES)


def check_model_dir(path: str | Path) -> dict:
    """Return the folder's config.json as a dict, or raise ModelLoadError naming the problem."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ModelLoadError(f"model path {folder} does not exist")
    if not folder.is_dir():
        raise ModelLoadError(f"model path {folder} is not a folder (expected a Hugging Face model folder)")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"model folder {folder} has no config.json")
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelLoadError(f"model folder {folder} has an unreadable config.json: {error}") from None
    architectures = config.get("architectures") or []
    if not any(name in SUPPORTED_ARCHITECTURES for name in architectures):
        found = ", ".join(architectures) or "none"
        raise ModelLoadError(
            f"model folder {folder} has unsupported architecture ({found}); supported: {supported_names()}"
        )
    if not weight_files(folder):
        raise ModelLoadError(f"model folder {folder} has no *.safetensors weights")
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        raise ModelLoadError(f"model folder {folder} has no tokenizer (tokenizer.json)")
    return config


def weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))
