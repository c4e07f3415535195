"""A session's past turns come back as sources once they have left the latest messages, named by their place
in the branch; turns of another branch (the question before an edit) never do."""

from tests.chatsvc.conftest import MODEL


def ask(client, content: str, session_id: str | None = None):
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=4,
        temperature=0,
        extra_body={"session_id": session_id} if session_id else {},
    )


def test_sources_come_from_the_branch_being_answered(server, client):
    first = ask(client, "My locker code is 4711.")
    session_id = first.session_id
    question = server.rest("GET", f"/api/sessions/{session_id}").json()["messages"][0]
    edited = server.rest(
        "POST",
        f"/api/messages/{question['id']}/edit",
        json={"content": "My favourite tea is green.", "max_tokens": 4},
    )
    assert edited.status_code == 200, edited.text
    for filler in ("Name a colour.", "Name a number."):  # the edited turn leaves the latest four messages
        ask(client, filler, session_id)

    ask(client, "What is my favourite tea, and my locker code?", session_id)
    branch = server.rest("GET", f"/api/sessions/{session_id}").json()["messages"]
    sources = branch[-2]["context"] or []
    assert ("turn 1 (user)", "My favourite tea is green.") in [(s["title"], s["text"]) for s in sources]
    assert not any("4711" in s["text"] for s in sources)
