"""Kill the server mid-reply and start it again: no message is lost, unfinished replies are marked."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.chatsvc.conftest import ADMIN_KEY, free_port, wait_healthy

REPO = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]


def start_server(data_dir: Path, port: int, model_dir: Path, log: Path) -> subprocess.Popen:
    command = [sys.executable, "app.py", "--port", str(port), "--data-dir", str(data_dir)]
    command += ["--model", str(model_dir), "--api-key", ADMIN_KEY]
    with log.open("a") as output:
        server = subprocess.Popen(command, cwd=REPO, stdout=output, stderr=subprocess.STDOUT)
    wait_healthy(f"http://127.0.0.1:{port}", process=server)
    return server


def stream_then_kill(server: subprocess.Popen, url: str) -> tuple[str, dict, dict]:
    """Streams a reply, queues a second one behind it, and kills the server mid-reply: the text received,
    a chunk of the first reply and the second one's first chunk."""
    with httpx.Client(base_url=url, headers=AUTH, timeout=60) as http:
        body = {"messages": STORY, "max_tokens": 300, "temperature": 0, "stream": True}
        with http.stream("POST", "/v1/chat/completions", json=body) as streaming:
            lines = streaming.iter_lines()
            received, chunk = "", None
            while len(received) < 20:
                if (line := next(lines)).startswith("data: {"):
                    chunk = json.loads(line.removeprefix("data: "))
                    received += chunk["choices"][0]["delta"].get("content") or ""
            # A second session's reply waits behind the first one (the engine runs one at a time).
            with http.stream("POST", "/v1/chat/completions", json=body) as queued:
                queued_lines = queued.iter_lines()  # kept referenced: dropping it would close the stream
                waiting = json.loads(next(queued_lines).removeprefix("data: "))
                time.sleep(1.0)  # past the 0.5 s save interval of the streaming reply
                server.send_signal(signal.SIGKILL)
                server.wait(timeout=30)
    return received, chunk, waiting


def test_a_killed_server_loses_no_message_and_marks_unfinished_replies_interrupted(tmp_path, smollm2_dir):
    port, log = free_port(), tmp_path / "server.log"
    url = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path / "data", port, smollm2_dir, log)
    try:
        received, chunk, waiting = stream_then_kill(server, url)
    finally:
        server.kill()
        server.wait()

    server = start_server(tmp_path / "data", port, smollm2_dir, log)
    try:
        sessions = httpx.get(f"{url}/api/sessions", headers=AUTH).json()
        assert {s["id"] for s in sessions["data"]} == {chunk["session_id"], waiting["session_id"]}
        streamed = httpx.get(f"{url}/api/sessions/{chunk['session_id']}", headers=AUTH).json()["messages"]
        assert [m["content"] for m in streamed][:1] == [STORY[0]["content"]]
        assert streamed[1]["status"] == "interrupted" and streamed[1]["error"]
        assert streamed[1]["content"].startswith(received)  # the partial reply, saved while it streamed
        pending = httpx.get(f"{url}/api/messages/{waiting['message_id']}", headers=AUTH).json()
        assert pending["status"] == "interrupted" and pending["session_id"] == waiting["session_id"]

        follow_up = {"messages": [{"role": "user", "content": "Go on."}], "max_tokens": 5, "temperature": 0}
        continued = httpx.post(
            f"{url}/v1/chat/completions",
            json={**follow_up, "session_id": chunk["session_id"]},
            headers=AUTH,
            timeout=60,
        )
        assert continued.status_code == 200 and continued.json()["choices"][0]["message"]["content"]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert "Traceback" not in log.read_text()
