"""The official openai client against a live server (uvicorn, a free port, the real SmolLM2, SQLite)."""

import contextlib
import time

import httpx
import openai
import pytest

from tests.chatsvc.conftest import ADMIN_KEY, MODEL

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]


def rest(server, method: str, path: str, headers: dict | None = None, **kwargs) -> httpx.Response:
    return httpx.request(
        method, f"{server.url}{path}", headers={**AUTH, **(headers or {})}, timeout=60, **kwargs
    )


def wait_finished(server, message_id: int, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while (message := rest(server, "GET", f"/api/messages/{message_id}").json())["status"] in (
        "pending",
        "streaming",
    ):
        assert time.monotonic() < deadline, f"message {message_id} still {message['status']}"
        time.sleep(0.1)
    return message


def test_a_plain_completion_starts_a_stored_session(server, client):
    completion = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=12, temperature=0)
    reply = completion.choices[0].message.content
    assert "Paris" in reply and completion.choices[0].finish_reason == "stop"
    usage = completion.usage
    assert usage.prompt_tokens > 10 and 0 < usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 0 <= usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens
    again = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=12, temperature=0)
    assert again.choices[0].message.content == reply
    # The same prompt again: every full block of it comes from the prefix cache.
    assert again.usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 16
    stored = rest(server, "GET", f"/api/sessions/{completion.session_id}").json()
    assert stored["title"] == "What is the capital of France?"
    assert [(m["role"], m["content"], m["status"]) for m in stored["messages"]] == [
        ("user", FRANCE[0]["content"], "done"),
        ("assistant", reply, "done"),
    ]
    assert stored["messages"][1]["id"] == completion.message_id
    assert stored["messages"][1]["completion_tokens"] == usage.completion_tokens


def test_a_streamed_completion_carries_the_session_id_and_ends_with_the_usage_chunk(server, client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=FRANCE,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert len({chunk.session_id for chunk in chunks}) == 1 and chunks[0].session_id
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert "Paris" in text
    assert [chunk.choices[0].finish_reason for chunk in chunks[:-1]][-1] == "stop"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens > 0
    stored = wait_finished(server, chunks[0].message_id)
    assert stored["content"] == text and stored["completion_tokens"] == usage_chunk.usage.completion_tokens


def test_a_session_continues_by_session_id_with_only_the_new_message(server, client):
    first = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=10, temperature=0)
    follow_up = [{"role": "user", "content": "And of Italy?"}]
    second = client.chat.completions.create(
        model=MODEL,
        messages=follow_up,
        max_tokens=10,
        temperature=0,
        extra_body={"session_id": first.session_id},
    )
    assert second.session_id == first.session_id
    # The server sent the history: the second prompt holds the first prompt, its reply and the new message.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens
    branch = rest(server, "GET", f"/api/sessions/{first.session_id}").json()["messages"]
    assert [m["content"] for m in branch] == [
        FRANCE[0]["content"],
        first.choices[0].message.content,
        "And of Italy?",
        second.choices[0].message.content,
    ]
    # A load balancer routes by header: the same continuation, naming the session there instead.
    third = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "And of Spain?"}],
        max_tokens=10,
        temperature=0,
        extra_headers={"X-Session-Id": first.session_id},
    )
    assert third.session_id == first.session_id
    assert third.usage.prompt_tokens > second.usage.prompt_tokens


def test_stop_strings_and_seeds_are_honoured(client):
    stopped = client.chat.completions.create(
        model=MODEL, messages=FRANCE, max_tokens=12, temperature=0, stop="Paris"
    )
    assert "Paris" not in stopped.choices[0].message.content
    assert stopped.choices[0].finish_reason == "stop"
    sampled = [
        client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=5, temperature=1.0, seed=7)
        for _ in range(2)
    ]
    assert sampled[0].choices[0].message.content == sampled[1].choices[0].message.content


def test_requests_without_a_valid_key_get_401(server):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="kvc-wrong", max_retries=0).models.list()
    response = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": FRANCE})
    assert response.status_code == 401 and "API key" in response.json()["error"]["message"]


def test_models_health_and_metrics(server, client):
    assert [model.id for model in client.models.list().data] == ["SmolLM2-135M-Instruct"]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok", "model": "SmolLM2-135M-Instruct"}
    metrics = httpx.get(f"{server.url}/metrics").text
    for name in (
        "time_to_first_token_seconds_count",
        "e2e_request_latency_seconds_count",
        "generation_tokens_total",
        'retrieval_latency_seconds_count{intent="knowledge"}',
        "session_kv_sessions",
        "weight_bytes",
        "kv_pool_bytes",
        "kv_pool_tokens",
    ):
        value = next(line for line in metrics.splitlines() if line.startswith(f"kvchat:{name} "))
        assert float(value.split()[-1]) > 0, value
    assert "kvchat:num_requests_running" in metrics and "kvchat:prefix_cache_hits_total" in metrics
    info = next(line for line in metrics.splitlines() if line.startswith("kvchat:engine_info{"))
    assert 'quantization="none"' in info and 'kv_cache_dtype="' in info and info.endswith(" 1.0")


def test_closing_a_stream_midway_stores_the_reply_as_aborted_with_its_partial_text(server, client):
    stream = client.chat.completions.create(
        model=MODEL, messages=STORY, max_tokens=300, temperature=0, stream=True
    )
    received, message_id = "", None
    for chunk in stream:
        message_id = chunk.message_id
        received += chunk.choices[0].delta.content or ""
        if len(received) > 20:
            break
    stream.close()
    stored = wait_finished(server, message_id)
    assert stored["status"] == "aborted" and stored["finish_reason"] == "abort"
    assert stored["content"].startswith(received) and stored["completion_tokens"] < 300


BAD_REQUESTS = {
    "empty message": ({"messages": [{"role": "user", "content": "  "}]}, 400, "empty"),
    "1 MB message": ({"messages": [{"role": "user", "content": "a" * 1_048_576}]}, 413, "larger than"),
    "unknown session": ({"messages": FRANCE, "session_id": "0" * 32}, 404, "not found"),
    "wrong types": ({"messages": "hello", "temperature": "hot"}, 422, "temperature"),
    "negative max_tokens": ({"messages": FRANCE, "max_tokens": -5}, 422, "max_tokens"),
    "history with a session": ({"messages": FRANCE * 2, "session_id": "0" * 32}, 400, "only the new"),
    "no user message last": ({"messages": [{"role": "assistant", "content": "hi"}]}, 400, "last message"),
    "too long for the model": (
        {"messages": [{"role": "user", "content": "word " * 20_000}]},
        400,
        "too long",
    ),
}


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_input_gets_a_clear_json_4xx_and_the_server_keeps_serving(server, case):
    body, status, phrase = BAD_REQUESTS[case]
    response = rest(server, "POST", "/v1/chat/completions", json=body)
    assert response.status_code == status
    assert phrase in response.json()["error"]["message"]
    assert "Traceback" not in response.text
    assert rest(server, "GET", "/v1/models").status_code == 200


def test_invalid_json_gets_400(server):
    json_type = {"Content-Type": "application/json"}
    response = rest(server, "POST", "/v1/chat/completions", content=b'{"messages": [', headers=json_type)
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]


def test_over_the_generation_limit_gets_429_with_retry_after(server, client):
    body = {"messages": STORY, "max_tokens": 200, "temperature": 0, "stream": True}
    with contextlib.ExitStack() as streams, httpx.Client(headers=AUTH, timeout=60) as http:
        open_streams = []  # kept referenced: dropping a line iterator closes its stream
        for _ in range(2):  # the server's limit
            response = streams.enter_context(
                http.stream("POST", f"{server.url}/v1/chat/completions", json=body)
            )
            open_streams.append(response.iter_lines())
            assert next(open_streams[-1]).startswith("data: ")
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=5)
        assert int(refused.value.response.headers["Retry-After"]) > 0


def test_regenerate_and_edit_make_branches(server, client):
    first = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=6, temperature=0)
    question = rest(server, "GET", f"/api/sessions/{first.session_id}").json()["messages"][0]
    again = rest(
        server, "POST", f"/api/messages/{first.message_id}/regenerate", json={"max_tokens": 6}
    ).json()
    assert again["reply"]["parent_id"] == question["id"] and again["reply"]["status"] == "done"
    edited = rest(
        server,
        "POST",
        f"/api/messages/{question['id']}/edit",
        json={"content": "Capital of Spain?", "max_tokens": 6},
    ).json()
    everything = rest(server, "GET", f"/api/sessions/{first.session_id}/messages").json()
    assert everything["count"] == 5  # question, reply, regenerated reply, edited question, its reply
    branch = rest(server, "GET", f"/api/sessions/{first.session_id}").json()["messages"]
    assert [m["content"] for m in branch[:1]] == ["Capital of Spain?"] and len(branch) == 2
    assert branch[-1]["id"] == edited["reply"]["id"] and branch[0]["parent_id"] is None
