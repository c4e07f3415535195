"""Bad values of flags and KVCHAT_* variables: one line each naming it, the value and what is allowed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chatsvc.settings import MIN_SESSION_BUDGET_TOKENS, settings_from_cli

APP = Path(__file__).resolve().parents[2] / "app.py"


def run_app(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(APP), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_app_names_each_bad_flag_with_what_it_allows_and_exits_2_before_loading_a_model(tmp_path):
    result = run_app(
        "--port",
        "abc",
        "--dtype=fp8",
        "--gpu-memory-utilization",
        "2",
        "--session-budget-tokens",
        "5",
        "--model",
        str(tmp_path / "no-model-here"),  # loading it would fail with another message
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: --port: 'abc' is not allowed: an integer from 1 to 65535",
        "error: --dtype: 'fp8' is not allowed: one of auto, float32, bfloat16, float16",
        "error: --gpu-memory-utilization: '2' is not allowed: a number that is greater than 0 and at most 1",
        f"error: --session-budget-tokens: '5' is not allowed: an integer that is at least "
        f"{MIN_SESSION_BUDGET_TOKENS}",
    ]


def test_app_names_a_bad_environment_variable():
    result = run_app(KVCHAT_PORT="abc")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: KVCHAT_PORT: 'abc' is not allowed: an integer from 1 to 65535"
    ]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--max-model-len", "3"],
            "error: --max-model-len: '3' is not allowed: an integer that is at least 16",
        ),
        (
            ["--distributed-executor-backend", "x"],
            "error: --distributed-executor-backend: 'x' is not allowed: one of mp, ray",
        ),
        (["--kv-cache-gb", "0"], "error: --kv-cache-gb: '0' is not allowed: a number that is greater than 0"),
        (["--port=70000"], "error: --port: '70000' is not allowed: an integer from 1 to 65535"),
        (["--quantization", "int4"], "error: --quantization: 'int4' is not allowed: one of int8"),
        (
            ["--quantization", "int8", "--engine", "vllm"],
            "error: --quantization int8 is the native engine's; vLLM loads models quantized ahead",
        ),
        (["--kv-cache-dtype", "fp8"], "error: --kv-cache-dtype: 'fp8' is not allowed: one of auto, int8"),
        (
            ["--kv-cache-dtype", "int8", "--engine", "vllm"],
            "error: --kv-cache-dtype int8 is the native engine's; vLLM's KV caches take fp8",
        ),
        (["--speculative", "eagle"], "error: --speculative: 'eagle' is not allowed: one of ngram"),
        (
            ["--num-speculative-tokens", "17"],
            "error: --num-speculative-tokens: '17' is not allowed: an integer from 1 to 16",
        ),
        (
            ["--prompt-lookup-min", "5"],
            "error: --prompt-lookup-min must not be above --prompt-lookup-max",
        ),
    ],
)
def test_settings_from_cli_describes_the_field_constraints(args, line, capsys):
    with pytest.raises(SystemExit) as exit:
        settings_from_cli(args)
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_a_bad_variable_is_named_as_such_and_a_flag_overrides_it(monkeypatch, capsys):
    monkeypatch.setenv("KVCHAT_ENABLE_PREFIX_CACHING", "maybe")
    with pytest.raises(SystemExit):
        settings_from_cli([])
    assert capsys.readouterr().err.splitlines() == [
        "error: KVCHAT_ENABLE_PREFIX_CACHING: 'maybe' is not allowed: true or false"
    ]
    monkeypatch.setenv("KVCHAT_PORT", "abc")
    monkeypatch.delenv("KVCHAT_ENABLE_PREFIX_CACHING")
    assert settings_from_cli(["--port", "8000"]).port == 8000
