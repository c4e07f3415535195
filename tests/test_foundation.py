import json
import re
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.model_files import ModelLoadError, check_model_dir
from engine.testing.tiny_models import TINY_CONFIGS


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_tiny_models_load_and_run_a_forward_pass(tiny_model_dirs, family):
    folder = tiny_model_dirs[family]
    config = check_model_dir(folder)
    assert config["model_type"] == family
    model = AutoModelForCausalLM.from_pretrained(folder)
    logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert logits.shape == (1, 4, config["vocab_size"])
    assert torch.isfinite(logits).all()


def test_real_model_knows_the_capital_of_france(smollm2_dir):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    output = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, inputs["input_ids"].shape[1] :])


def bad_model_folders(tmp_path, smollm2_dir):
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((smollm2_dir / "config.json").read_text())
    unsupported = tmp_path / "gpt2"
    unsupported.mkdir()
    (unsupported / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    return {
        tmp_path / "missing": "does not exist",
        tmp_path: "has no config.json",
        no_weights: "has no *.safetensors weights",
        unsupported: "unsupported architecture (GPT2LMHeadModel); supported: LlamaForCausalLM",
    }


def test_bad_model_folders_raise_a_clear_error(tmp_path, smollm2_dir):
    for folder, message in bad_model_folders(tmp_path, smollm2_dir).items():
        with pytest.raises(ModelLoadError, match=re.escape(message)):
            check_model_dir(folder)


def test_app_reports_a_bad_model_in_one_line_without_traceback(tmp_path, smollm2_dir):
    cases = list(bad_model_folders(tmp_path, smollm2_dir).items())
    for folder, message in (cases[0], cases[-1]):
        result = subprocess.run(
            [sys.executable, "app.py", "--model", str(folder), "--data-dir", str(tmp_path / "data")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode != 0
        assert result.stderr.strip().splitlines() == [f"error: {result.stderr.strip()[7:]}"]
        assert message in result.stderr and "Traceback" not in result.stderr


def test_app_help_lists_the_settings():
    result = subprocess.run([sys.executable, "app.py", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    for flag in (
        "--host",
        "--port",
        "--model",
        "--dtype",
        "--db-url",
        "--data-dir",
        "--api-key",
        "--admin-password",
    ):
        assert flag in result.stdout
