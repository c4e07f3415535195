"""Session memory through the API: a session's next turn reuses its KV, admins see and move sessions' KV,
a small budget forces an eviction that the admin page shows, deleting a session deletes its KV."""

import re

from chatsvc import crud
from tests.chatsvc.conftest import ADMIN_KEY, MODEL

QUESTIONS = ["What is the capital of France?", "And of Italy?", "Which of the two is larger?"]
LONG_TEXT = "The quick brown fox jumps over the lazy dog near the river bank. " * 28  # ~360 tokens


def prefill_tokens(server) -> float:
    metrics = server.rest("GET", "/metrics", key=None).text
    return float(re.search(r"^kvchat:prefill_tokens_total (\S+)$", metrics, re.MULTILINE).group(1))


def ask(client, content: str, max_tokens: int = 8, **extra):
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        temperature=0,
        extra_body=extra,
    )


def kv_detail(server, session_id: str) -> dict:
    response = server.rest("GET", f"/api/admin/kv/sessions/{session_id}")
    assert response.status_code == 200, response.text
    return response.json()


def test_each_turn_reuses_the_session_kv_and_prefills_only_its_new_tokens(server, client):
    session_id, previous = None, None
    for question in QUESTIONS:
        server.wait_idle()
        before = prefill_tokens(server)
        completion = ask(client, question, **({"session_id": session_id} if session_id else {}))
        session_id, usage = completion.session_id, completion.usage
        cached = usage.prompt_tokens_details.cached_tokens
        assert prefill_tokens(server) - before == usage.prompt_tokens - cached
        if previous is not None:
            # The previous prompt and reply come from the session's KV (the reply's last token aside).
            assert cached >= previous.prompt_tokens + previous.completion_tokens - 2
        previous = usage
    assert previous.prompt_tokens_details.cached_tokens > 0


def listed_kv(server, title: str) -> dict:
    rows = server.rest("GET", "/api/admin/kv/sessions", params={"title": title}).json()
    assert rows["count"] == 1
    return rows["data"][0]


def kv_action(server, session_id: str, action: str) -> dict:
    response = server.rest("POST", f"/api/admin/kv/sessions/{session_id}/{action}")
    assert response.status_code == 200, response.text
    return response.json()["kv"]


def test_admins_see_a_sessions_kv_and_persist_evict_and_drop_it(server, client):
    completion = ask(client, "Name a primary colour.")
    session_id = completion.session_id
    server.wait_idle()
    row = listed_kv(server, "primary colour")
    assert (row["session_id"], row["owner"], row["turns"], row["kv_location"]) == (
        session_id,
        "admin",
        1,
        "pool",
    )
    assert row["tokens"] == completion.usage.total_tokens and row["kv_cached_tokens"] > 0
    kv = kv_detail(server, session_id)["kv"]
    assert kv["available"] and kv["location"] == "pool" and kv["bytes_on_disk"] == 0
    assert len(kv["positions"]) == len(kv["importance"]) == kv["cached_tokens"] > 0
    kv_file = server.data_dir / "sessions" / f"{session_id}.safetensors"

    persisted = kv_action(server, session_id, "persist")
    assert persisted["location"] == "pool" and persisted["bytes_on_disk"] == kv_file.stat().st_size > 0
    assert kv_action(server, session_id, "evict")["location"] == "disk"
    assert listed_kv(server, "primary colour")["kv_location"] == "disk"
    dropped = kv_action(server, session_id, "drop")
    assert dropped["location"] == "none" and dropped["bytes_on_disk"] == 0 and not kv_file.exists()
    refused = server.rest("POST", f"/api/admin/kv/sessions/{session_id}/evict")
    assert refused.status_code == 409 and "no KV in the pool" in refused.json()["error"]["message"]
    # The conversation is intact: the next turn recomputes it and keeps its KV again.
    again = ask(client, "Name another one.", session_id=session_id)
    assert again.usage.prompt_tokens_details.cached_tokens < completion.usage.total_tokens
    server.wait_idle()
    assert kv_detail(server, session_id)["kv"]["location"] == "pool"


def test_the_kv_admin_routes_are_for_admins_only(server):
    user_key = server.rest("POST", "/api/admin/users", json={"username": "kv-viewer"}).json()["api_key"]
    for method, path in [
        ("GET", "/api/admin/kv/sessions"),
        ("GET", "/api/admin/engine"),
        ("POST", "/api/admin/kv/sessions/0/drop"),
    ]:
        response = server.rest(method, path, key=user_key)
        assert response.status_code == 403, (path, response.text)


def test_a_small_kv_budget_forces_an_eviction_the_admin_page_shows(server, client):
    too_small = server.rest("POST", "/api/sessions", json={"kv_budget_tokens": 100})
    assert too_small.status_code == 400 and "at least 261" in too_small.json()["error"]["message"]
    session_id = server.rest("POST", "/api/sessions", json={"kv_budget_tokens": 261}).json()["id"]
    first = ask(client, LONG_TEXT + "\nWhat animal jumps?", max_tokens=4, session_id=session_id)
    assert first.usage.prompt_tokens > 261
    server.wait_idle()
    detail = kv_detail(server, session_id)
    kv, events = detail["kv"], detail["eviction_events"]
    assert kv["cached_tokens"] <= 261 < kv["text_tokens"] and kv["evicted_tokens"] == kv["text_tokens"] - 261
    assert len(events) == 1 and events[0]["policy"] == "attention"
    event = events[0]
    assert event["num_tokens_before"] == first.usage.total_tokens - 1  # the last reply token has no KV yet
    assert event["details"]["tokens_after"] == 261
    assert event["details"]["kept_spans"][0][0] == 0  # the sink tokens stay
    with server.service.db.begin() as db:
        stored = crud.eviction_events(db, session_id)
        assert [(e.num_tokens_before, e.num_tokens_evicted) for e in stored] == [
            (event["num_tokens_before"], event["num_tokens_evicted"])
        ]
    second = ask(client, "Thanks!", max_tokens=4, session_id=session_id)
    assert second.choices[0].message.content and second.usage.prompt_tokens_details.cached_tokens > 261
    server.wait_idle()
    assert len(kv_detail(server, session_id)["eviction_events"]) == 2


def test_deleting_a_session_deletes_its_kv_and_its_indexed_turns(server, client):
    session_id = ask(client, "Say hello.").session_id
    server.wait_idle()
    assert server.rest("POST", f"/api/admin/kv/sessions/{session_id}/persist").status_code == 200
    kv_file = server.data_dir / "sessions" / f"{session_id}.safetensors"
    retriever = server.service.sources.retriever
    memory = server.service.engines.session_memory()
    assert kv_file.exists() and len(retriever.list_documents(f"session:{session_id}")) == 2
    assert server.rest("DELETE", f"/api/sessions/{session_id}").status_code == 200
    assert not kv_file.exists() and retriever.list_documents(f"session:{session_id}") == []
    assert not memory.engine.call_sync(lambda: session_id in memory.cache.sessions)
    assert server.rest("GET", f"/api/admin/kv/sessions/{session_id}", key=ADMIN_KEY).status_code == 404


def test_the_engine_panel_reports_load_and_session_memory(server, client):
    ask(client, "Count to three.")
    panel = server.rest("GET", "/api/admin/engine").json()
    assert panel["state"] == "ready" and panel["kv_blocks_total"] > 0
    assert panel["ttft_p50_s"] > 0 and panel["ttft_p99_s"] >= panel["ttft_p50_s"]
    assert panel["session_memory"]["sessions_in_pool"] >= 1 and panel["session_memory"]["reused_tokens"] > 0
    assert 0 <= panel["prefix_cache_hit_rate"] <= 1
    assert "minilm: " in panel["embedding_models"]  # the session's turns are indexed in English
    ask(client, "Count to four.")
    assert server.rest("GET", "/api/admin/engine").json()["generation_tokens_per_s"] > 0
