"""A session's past turns come back as sources only once the model no longer sees them (their tokens were
evicted from the session's KV, or they left the prompt), named by their place in the branch; turns of
another branch (the question before an edit) never do."""

from tests.chatsvc.conftest import MODEL

# About 150 tokens each: two of them push the first turn out of a 261-token KV budget (sinks + the recent
# 256 tokens + one heavy hitter).
FILLERS = [
    "Here is a note about my garden, no need to comment on it. " * 12,
    "Here is a note about my kitchen, no need to comment on it. " * 12,
]


def ask(client, content: str, session_id: str):
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=4,
        temperature=0,
        extra_body={"session_id": session_id},
    )


def chat_with_an_edited_first_question(server, client, kv_budget_tokens: int | None) -> list[dict]:
    settings = {"kv_budget_tokens": kv_budget_tokens} if kv_budget_tokens else {}
    session_id = server.rest("POST", "/api/sessions", json=settings).json()["id"]
    ask(client, "My locker code is 4711.", session_id)
    question = server.rest("GET", f"/api/sessions/{session_id}").json()["messages"][0]
    edited = server.rest(
        "POST",
        f"/api/messages/{question['id']}/edit",
        json={"content": "My favourite tea is green.", "max_tokens": 4},
    )
    assert edited.status_code == 200, edited.text
    for filler in FILLERS:
        ask(client, filler, session_id)
        server.wait_idle()  # the turn's KV is in, and evicted, before the next question looks at it
    ask(client, "What is my favourite tea, and my locker code?", session_id)
    return server.rest("GET", f"/api/sessions/{session_id}").json()["messages"]


def test_an_evicted_turn_of_the_branch_comes_back_and_the_other_branch_never(server, client):
    branch = chat_with_an_edited_first_question(server, client, kv_budget_tokens=261)
    sources = branch[-2]["context"] or []
    assert ("turn 1 (user)", "My favourite tea is green.") in [(s["title"], s["text"]) for s in sources]
    assert not any("4711" in s["text"] for s in sources)
    assert branch[-2]["retrieval"]["past_turns"]["out_of_view"] >= 1


def test_a_turn_the_session_still_holds_is_not_retrieved_again(server, client):
    branch = chat_with_an_edited_first_question(server, client, kv_budget_tokens=None)
    sources = branch[-2]["context"] or []
    assert not any(s["title"].startswith("turn ") for s in sources), sources
    assert branch[-2]["retrieval"]["past_turns"] == {"in_view": 6, "out_of_view": 0}
