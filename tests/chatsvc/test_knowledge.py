"""Knowledge bases through the API: upload (one bad file rejected with its reason), an answer that cites the
document by name and paragraph, try a query, delete; the server's upload limits."""

from tests.chatsvc.conftest import MODEL

SHIPPING = b"""# Shipping

Parcels to Norway take 4 working days and cost 9 euros.

# Returns

Items can be returned within 30 days of delivery, in their original packaging.
"""
QUESTION = "How long does shipping to Norway take?"


def upload_shop_help(server) -> tuple[str, dict]:
    """A knowledge base with one good document and two files rejected with their reasons."""
    kb = server.rest("POST", "/api/knowledge-bases", json={"name": "Shop help"}).json()["id"]
    files = [
        ("files", ("shipping.md", SHIPPING, "text/markdown")),
        ("files", ("setup.exe", b"MZ\x00\x01", "application/octet-stream")),
        ("files", ("huge.txt", b"words " * 1000, "text/plain")),  # over the server's 4,000-byte file limit
    ]
    uploaded = server.rest("POST", f"/api/knowledge-bases/{kb}/documents", files=files).json()
    assert [d["name"] for d in uploaded["added"]] == ["shipping.md"]
    reasons = {r["name"]: r["reason"] for r in uploaded["rejected"]}
    assert "unsupported file type .exe" in reasons["setup.exe"] and "limit" in reasons["huge.txt"]
    documents = server.rest("GET", f"/api/knowledge-bases/{kb}/documents").json()
    assert [(d["name"], d["num_paragraphs"]) for d in documents["data"]] == [("shipping.md", 2)]
    return kb, documents["data"][0]


def test_a_knowledge_base_answers_with_numbered_citations_of_its_documents(server, client):
    kb, document = upload_shop_help(server)
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=24,
        temperature=0,
        extra_body={"knowledge_base_id": kb},
    )
    assert "4 working days" in completion.choices[0].message.content
    reply = server.rest("GET", f"/api/messages/{completion.message_id}").json()
    first = reply["citations"][0]
    assert (first["n"], first["title"]) == (1, "shipping.md") and "Norway" in first["text"]
    question = server.rest("GET", f"/api/sessions/{completion.session_id}").json()["messages"][0]
    assert question["retrieval"]["intent"] == "knowledge" and question["retrieval"]["latency_ms"] > 0
    assert [s["n"] for s in question["context"]] == list(range(1, len(question["context"]) + 1))

    preview = server.rest("POST", f"/api/knowledge-bases/{kb}/query", json={"query": QUESTION, "k": 2}).json()
    assert preview["intent"] == "knowledge" and preview["num_tokens"] <= preview["budget_tokens"]
    assert preview["passages"][0]["paragraph_ids"] == first["paragraph_ids"]
    assert [hit["document_name"] for hit in preview["hits"]] == ["shipping.md", "shipping.md"]
    assert preview["hits"][0]["score"] > preview["hits"][1]["score"]

    assert server.rest("DELETE", f"/api/knowledge-bases/{kb}/documents/{document['id']}").status_code == 200
    assert server.rest("GET", f"/api/knowledge-bases/{kb}/documents").json()["count"] == 0
    again = server.rest("POST", f"/api/knowledge-bases/{kb}/query", json={"query": QUESTION}).json()
    assert again["passages"] == [] and again["hits"] == []
    assert server.rest("DELETE", f"/api/knowledge-bases/{kb}").status_code == 200
    assert server.rest("GET", f"/api/knowledge-bases/{kb}/documents").status_code == 404


def test_uploads_have_their_own_size_limit_and_bad_requests_get_clear_errors(server):
    kb = server.rest("POST", "/api/knowledge-bases", json={"name": "Limits"}).json()["id"]
    too_big = [("files", (f"part{i}.txt", b"x" * 3000, "text/plain")) for i in range(30)]  # 90 kB > 64 kB
    response = server.rest("POST", f"/api/knowledge-bases/{kb}/documents", files=too_big)
    assert response.status_code == 413 and "larger than the limit" in response.json()["error"]["message"]
    missing = server.rest("POST", f"/api/knowledge-bases/{kb}/documents")
    assert missing.status_code == 422 and "files" in missing.json()["error"]["message"]
    empty_query = server.rest("POST", f"/api/knowledge-bases/{kb}/query", json={"query": ""})
    assert empty_query.status_code == 422
    unknown = server.rest("DELETE", f"/api/knowledge-bases/{kb}/documents/999999")
    assert unknown.status_code == 404


def test_the_embedding_model_follows_the_language_and_can_be_changed(server):
    kb = server.rest("POST", "/api/knowledge-bases", json={"name": "售后"}).json()["id"]
    path = f"/api/knowledge-bases/{kb}/embedding-model"
    assert server.rest("GET", path).json() == {"name": None, "choices": ["minilm", "multilingual-e5-small"]}
    files = [("files", ("退货.md", "商品签收后七天内可以无理由退货。".encode(), "text/markdown"))]
    assert server.rest("POST", f"/api/knowledge-bases/{kb}/documents", files=files).status_code == 200
    assert server.rest("GET", path).json()["name"] == "multilingual-e5-small"
    changed = server.rest("PUT", path, json={"embedding_model": "minilm"})
    assert changed.status_code == 200 and changed.json()["name"] == "minilm"
    unknown = server.rest("PUT", path, json={"embedding_model": "../../bert"})
    assert unknown.status_code == 400 and "unknown encoder" in unknown.json()["error"]["message"]
    preview = server.rest("POST", f"/api/knowledge-bases/{kb}/query", json={"query": "退货"}).json()
    assert preview["hits"][0]["text"].startswith("商品签收后")
