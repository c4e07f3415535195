"""The ownership matrix: anonymous, user A, user B and the admin against every kind of route, on SQLite and
Postgres.  The engine is never loaded here, so a request that passes every check and needs it ends in 503
(the retriever works without it)."""

import pytest
from fastapi.testclient import TestClient

from chatsvc import crud
from chatsvc.api.main import create_api
from tests.chatsvc.conftest import ADMIN_KEY, server_settings

CALLERS = ["anonymous", "B", "admin", "A"]  # A last: some of A's calls change what the others would see


@pytest.fixture
def world(db_url, tmp_path, smollm2_dir):
    """A's session with a question and a reply, A's knowledge base with a document, and keys for A, B and
    the admin."""
    app = create_api(server_settings(tmp_path, smollm2_dir, db_url=db_url))
    client = TestClient(app)  # no lifespan: the engine stays unloaded
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    keys = {"admin": ADMIN_KEY, "anonymous": None}
    for name in ("A", "B"):
        created = client.post("/api/admin/users", json={"username": name}, headers=admin)
        assert created.status_code == 201, created.text
        keys[name] = created.json()["api_key"]
    as_a = {"Authorization": f"Bearer {keys['A']}"}
    session_id = client.post("/api/sessions", json={"title": "A's plans"}, headers=as_a).json()["id"]
    kb_id = client.post("/api/knowledge-bases", json={"name": "A's manuals"}, headers=as_a).json()["id"]
    upload = client.post(f"/api/knowledge-bases/{kb_id}/documents", files=[DOCUMENT], headers=as_a).json()
    document_id = upload["added"][0]["id"]
    key_id = client.get("/api/keys", headers=as_a).json()["data"][0]["id"]
    with app.state.service.db.begin() as db:
        session = crud.find_any_session(db, session_id)
        question = crud.add_message(db, session, None, "user", "secret question")
        reply = crud.add_message(db, session, question.id, "assistant", "secret answer")
        ids = dict(
            session=session_id, question=question.id, reply=reply.id, kb=kb_id, doc=document_id, key=key_id
        )
    yield client, keys, ids
    app.state.service.db.kw["bind"].dispose()  # what the lifespan would do at shutdown


DOCUMENT = ("files", ("manual.txt", b"Press the red button to start the machine.", "text/plain"))

# (method, path, body, expected status for anonymous, B, admin, A)
ROUTES = [
    ("GET", "/api/sessions/{session}", None, (401, 404, 404, 200)),
    ("PATCH", "/api/sessions/{session}", {"title": "renamed"}, (401, 404, 404, 200)),
    ("GET", "/api/sessions/{session}/messages", None, (401, 404, 404, 200)),
    ("GET", "/api/messages/{question}", None, (401, 404, 404, 200)),
    ("GET", "/api/messages/{reply}", None, (401, 404, 404, 200)),
    ("POST", "/api/messages/{reply}/regenerate", {}, (401, 404, 404, 503)),
    ("POST", "/api/messages/{question}/edit", {"content": "other question"}, (401, 404, 404, 503)),
    ("POST", "/v1/chat/completions", "continue", (401, 404, 404, 503)),
    ("POST", "/api/sessions/{session}/stop", None, (401, 404, 404, 200)),
    ("GET", "/api/knowledge-bases/{kb}", None, (401, 404, 404, 200)),
    ("GET", "/api/knowledge-bases/{kb}/documents", None, (401, 404, 404, 200)),
    ("POST", "/api/knowledge-bases/{kb}/documents", "upload", (401, 404, 404, 200)),
    ("POST", "/api/knowledge-bases/{kb}/query", {"query": "red button?"}, (401, 404, 404, 200)),
    ("GET", "/api/knowledge-bases/{kb}/embedding-model", None, (401, 404, 404, 200)),
    ("PUT", "/api/knowledge-bases/{kb}/embedding-model", {"embedding_model": "minilm"}, (401, 404, 404, 200)),
    ("DELETE", "/api/knowledge-bases/{kb}/documents/{doc}", None, (401, 404, 404, 200)),
    ("DELETE", "/api/keys/{key}", None, (401, 404, 404, 200)),
    ("GET", "/api/admin/users", None, (401, 403, 200, 403)),
    ("GET", "/api/admin/sessions", None, (401, 403, 200, 403)),
    ("GET", "/api/admin/sessions/{session}", None, (401, 403, 200, 403)),
    ("POST", "/api/admin/users", {"username": "C"}, (401, 403, 201, 403)),
    ("GET", "/api/admin/kv/sessions", None, (401, 403, 200, 403)),
    ("GET", "/api/admin/kv/sessions/{session}", None, (401, 403, 200, 403)),
    ("POST", "/api/admin/kv/sessions/{session}/persist", None, (401, 403, 503, 403)),
    ("GET", "/api/admin/engine", None, (401, 403, 200, 403)),
    ("DELETE", "/api/knowledge-bases/{kb}", None, (401, 404, 404, 200)),
    ("DELETE", "/api/sessions/{session}", None, (401, 404, 404, 200)),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "expected"), ROUTES, ids=[f"{r[0]} {r[1]}" for r in ROUTES]
)
def test_ownership_matrix(world, method, path, body, expected):
    client, keys, ids = world
    if body == "continue":
        body = {"messages": [{"role": "user", "content": "and then?"}], "session_id": ids["session"]}
    for caller, status in zip(CALLERS, expected, strict=True):
        headers = {"Authorization": f"Bearer {keys[caller]}"} if keys[caller] else {}
        if body == "upload":
            upload = [("files", (f"by-{caller}.txt", b"Some notes.", "text/plain"))]
            response = client.request(method, path.format(**ids), files=upload, headers=headers)
        else:
            response = client.request(method, path.format(**ids), json=body, headers=headers)
        assert response.status_code == status, f"{caller}: {response.status_code} {response.text}"
        assert "error" in response.json() or status < 400


def test_others_see_nothing_of_a_session_in_lists_and_search_and_cannot_add_to_it(world):
    client, keys, ids = world
    as_b = {"Authorization": f"Bearer {keys['B']}"}
    assert client.get("/api/sessions", headers=as_b).json()["count"] == 0
    assert client.get("/api/sessions", params={"q": "secret"}, headers=as_b).json()["count"] == 0
    as_a = {"Authorization": f"Bearer {keys['A']}"}
    assert client.get("/api/sessions", params={"q": "secret"}, headers=as_a).json()["count"] == 1
    attach = client.post("/api/sessions", json={"knowledge_base_id": ids["kb"]}, headers=as_b)
    assert attach.status_code == 404
    messages = client.get(f"/api/sessions/{ids['session']}/messages", headers=as_a).json()
    assert [m["content"] for m in messages["data"]] == ["secret question", "secret answer"]
    as_admin = {"Authorization": f"Bearer {keys['admin']}"}
    assert client.get("/api/admin/sessions", headers=as_admin).json()["count"] == 1


def test_an_unknown_or_revoked_key_gets_401(world):
    client, keys, ids = world
    assert client.get("/api/me", headers={"Authorization": "Bearer kvc-made-up"}).status_code == 401
    as_a = {"Authorization": f"Bearer {keys['A']}"}
    assert client.delete(f"/api/keys/{ids['key']}", headers=as_a).status_code == 200
    response = client.get("/api/me", headers=as_a)
    assert response.status_code == 401 and response.headers["WWW-Authenticate"] == "Bearer"
