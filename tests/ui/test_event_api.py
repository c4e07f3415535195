"""The pages' event API through gradio_client: it needs a login, a chat turn works through it, the admin
events refuse a non-admin, and an event the page does not have is a clear 404."""

import gradio_client
import httpx
import pytest
from gradio_client.exceptions import AppError

from tests.ui.conftest import ADMIN_PASSWORD, ALICE


def test_a_chat_turn_through_the_event_api(server):
    client = gradio_client.Client(f"{server.url}/", auth=ALICE, verbose=False)
    outputs = client.predict("What is the capital of France?", "", "", 0, api_name="/send")
    chat = outputs[0]
    assert [m["role"] for m in chat][:2] == ["user", "assistant"]
    assert "Paris" in chat[1]["content"][0]["text"]
    found = server.rest(
        "GET", "/api/sessions", key=server.user_keys["alice"], params={"q": "capital of France"}
    )
    session = found.json()["data"][0]
    assert session["title"] == "What is the capital of France?"
    reply = server.rest("GET", f"/api/sessions/{session['id']}", key=server.user_keys["alice"]).json()[
        "messages"
    ][-1]
    assert reply["status"] == "done" and "Paris" in reply["content"]


def test_admin_events_refuse_a_non_admin(server):
    user = gradio_client.Client(f"{server.url}/", auth=ALICE, verbose=False)
    for api_name, arguments in (("/admin_sessions", ("", "")), ("/engine_panel", ()), ("/kv_drop", ("", ""))):
        with pytest.raises(AppError, match="admins"):
            user.predict(*arguments, api_name=api_name)
    admin = gradio_client.Client(f"{server.url}/", auth=("admin", ADMIN_PASSWORD), verbose=False)
    rows = admin.predict("alice", "", api_name="/admin_sessions")
    assert rows["data"] and {row[1] for row in rows["data"]} == {"alice"}


def test_the_event_api_needs_a_login(server):
    with pytest.raises(Exception, match=r"(?i)login|auth|credentials"):
        gradio_client.Client(f"{server.url}/", verbose=False).predict("Hi", "", "", 0, api_name="/send")
    with pytest.raises(Exception, match=r"(?i)credentials|login"):
        gradio_client.Client(f"{server.url}/", auth=("alice", "wrong password"), verbose=False)


def test_choosing_an_embedding_model_refuses_hostile_payloads(server):
    alice = gradio_client.Client(f"{server.url}/", auth=ALICE, verbose=False)
    kb = server.rest("POST", "/api/knowledge-bases", key=server.user_keys["alice"], json={"name": "Models"})
    theirs = server.rest("POST", "/api/knowledge-bases", json={"name": "The admin's"}).json()["id"]
    mine = kb.json()["id"]
    hostile = [(mine, "../../etc/passwd"), (mine, 7), (theirs, "minilm"), (None, "minilm")]
    for knowledge_base, model in hostile:
        with pytest.raises(AppError):
            alice.predict(knowledge_base, model, api_name="/choose_embedding_model")
    for knowledge_base, key in ((mine, server.user_keys["alice"]), (theirs, None)):
        path = f"/api/knowledge-bases/{knowledge_base}/embedding-model"
        assert server.rest("GET", path, **({"key": key} if key else {})).json()["name"] is None


def test_an_event_the_page_does_not_have_is_a_404_not_a_server_error(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.post("/login", data={"username": ALICE[0], "password": ALICE[1]}).raise_for_status()
        body = {"data": [], "fn_index": 987_654, "session_hash": "a-page-never-loaded"}
        answer = client.post("/gradio_api/queue/join", json=body)
    assert answer.status_code == 404
    assert "no such event" in answer.json()["detail"]
