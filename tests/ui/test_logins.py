"""The UI's login through HTTP and the event API: every event re-checks its login against the database, so a
deleted user (or one whose name is given to someone new) loses access at once; logins end on logout and
expire; wrong passwords are throttled with 429; a login posted from another site is refused."""

import logging
import re
from datetime import timedelta

import gradio_client
import httpx
import pytest
from gradio_client.exceptions import AppError
from sqlalchemy import update

from chatsvc.models import Login, utcnow
from chatsvc.ui.identity import LOGIN_COOKIE


def assert_refused(client: gradio_client.Client) -> None:
    """Gradio refuses the event (401) or, had it been queued before, the handler does."""
    with pytest.raises((AppError, httpx.HTTPStatusError)) as refused:
        create_knowledge_base(client, "Should not exist")
    assert re.search("401 Unauthorized|not logged in", str(refused.value))


def create_user(server, username: str, password: str) -> dict:
    """The new user's id and first API key."""
    created = server.rest("POST", "/api/admin/users", json={"username": username, "password": password})
    assert created.status_code == 201, created.text
    return created.json()


def create_knowledge_base(client: gradio_client.Client, name: str) -> list[str]:
    """The names of the caller's knowledge bases, the new one among them."""
    dropdown = client.predict(name, api_name="/create_knowledge_base")[0]
    return [name for name, _ in dropdown["choices"]]


def log_in(server, username: str, password: str, **headers) -> httpx.Response:
    form = {"username": username, "password": password}
    return httpx.post(f"{server.url}/login", data=form, headers=headers)


def test_a_deleted_users_open_page_is_refused_even_when_a_new_user_gets_the_name(server):
    dora_id = create_user(server, "dora", "dora-password-1")["id"]
    old_page = gradio_client.Client(f"{server.url}/", auth=("dora", "dora-password-1"), verbose=False)
    assert create_knowledge_base(old_page, "Dora's notes") == ["Dora's notes"]

    assert server.rest("DELETE", f"/api/admin/users/{dora_id}").status_code == 200
    assert_refused(old_page)

    new_dora = create_user(server, "dora", "another-password-2")["id"]
    assert new_dora > dora_id
    new_page = gradio_client.Client(f"{server.url}/", auth=("dora", "another-password-2"), verbose=False)
    assert_refused(old_page)
    assert create_knowledge_base(new_page, "The new Dora's") == ["The new Dora's"]


def test_a_new_password_or_disabling_ends_the_users_open_pages_at_once(server):
    created = create_user(server, "gina", "gina-password-1")
    gina, gina_key = created["id"], created["api_key"]
    page = gradio_client.Client(f"{server.url}/", auth=("gina", "gina-password-1"), verbose=False)
    create_knowledge_base(page, "Gina's")
    wrong = server.rest(
        "PUT", "/api/me/password", key=gina_key, json={"current_password": "x", "new_password": "y" * 8}
    )
    assert wrong.status_code == 403
    changed = server.rest(
        "PUT",
        "/api/me/password",
        key=gina_key,
        json={"current_password": "gina-password-1", "new_password": "gina-password-2"},
    )
    assert changed.status_code == 200, changed.text
    assert_refused(page)

    page = gradio_client.Client(f"{server.url}/", auth=("gina", "gina-password-2"), verbose=False)
    create_knowledge_base(page, "Gina's second")
    disabled = server.rest("PATCH", f"/api/admin/users/{gina}", json={"disabled": True})
    assert disabled.status_code == 200 and disabled.json()["disabled"] is True
    assert_refused(page)
    assert log_in(server, "gina", "gina-password-2").status_code == 401
    assert server.rest("GET", "/api/me", key=gina_key).status_code == 401
    server.rest("PATCH", f"/api/admin/users/{gina}", json={"disabled": False})
    assert server.rest("GET", "/api/me", key=gina_key).json()["username"] == "gina"
    assert log_in(server, "gina", "gina-password-2").status_code == 200


def test_logging_out_or_an_expired_login_ends_access(server):
    erin = create_user(server, "erin", "erin-password-1")["id"]
    cookies = dict(log_in(server, "erin", "erin-password-1").cookies)
    page = httpx.get(f"{server.url}/", cookies=cookies)
    assert page.status_code == 200

    as_an_image = {"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image", "Sec-Fetch-Site": "same-origin"}
    httpx.get(f"{server.url}/logout", cookies=cookies, headers=as_an_image)  # ![x](/logout) in a message
    assert httpx.get(f"{server.url}/", cookies=cookies).status_code == 200
    logged_out = httpx.get(f"{server.url}/logout", cookies=cookies)
    assert logged_out.status_code == 303 and logged_out.headers["location"] == "/login"
    refused = httpx.get(f"{server.url}/knowledge", cookies=cookies)
    assert refused.status_code == 303 and refused.headers["location"] == "/login?next=/knowledge"

    client = gradio_client.Client(f"{server.url}/", auth=("erin", "erin-password-1"), verbose=False)
    create_knowledge_base(client, "Erin's")
    with server.service.db.begin() as db:
        expired = utcnow() - timedelta(seconds=1)
        db.execute(update(Login).where(Login.user_id == erin).values(expires_at=expired))
    assert_refused(client)


def test_wrong_passwords_are_throttled_per_user_with_retry_after_and_logged(server, caplog):
    create_user(server, "frank", "frank-password-1")
    limit = server.service.accounts.logins.policy.failures_per_user
    try:
        for _ in range(limit):
            assert log_in(server, "frank", "a wrong password").status_code == 401
        with caplog.at_level(logging.WARNING, logger="chatsvc.logins"):
            throttled = log_in(server, "frank", "frank-password-1")
        assert throttled.status_code == 429
        assert int(throttled.headers["Retry-After"]) > 0
        assert "too many failed logins" in throttled.json()["detail"]
        assert LOGIN_COOKIE not in throttled.cookies
        assert any("frank" in record.getMessage() for record in caplog.records)
        assert log_in(server, "nobody-at-all", "x").status_code == 401  # other names go on
    finally:
        server.service.accounts.logins.throttle.attempts.clear()


def test_a_login_posted_from_another_site_is_refused(server):
    refused = log_in(server, "alice", "alice-password-1", Origin="http://evil.example")
    assert refused.status_code == 403 and LOGIN_COOKIE not in refused.cookies
    accepted = log_in(server, "alice", "alice-password-1", Origin=server.url)
    assert accepted.status_code == 200 and LOGIN_COOKIE in accepted.cookies


def test_a_browser_login_goes_back_to_its_page_and_never_to_another_host(server):
    form = {"username": "alice", "password": "alice-password-1", "next": "//evil.example/"}
    html = {"Accept": "text/html"}
    sent = httpx.post(f"{server.url}/login", data=form, headers=html)
    assert sent.status_code == 303 and sent.headers["location"] == "/"
    cookie = sent.cookies[LOGIN_COOKIE]
    set_cookie = sent.headers["set-cookie"].lower()
    assert "httponly" in set_cookie and "samesite=lax" in set_cookie
    wrong = httpx.post(f"{server.url}/login", data={**form, "password": "wrong"}, headers=html)
    assert wrong.status_code == 401 and "Wrong user name or password." in wrong.text
    assert httpx.get(f"{server.url}/admin", cookies={LOGIN_COOKIE: cookie}).status_code == 200
