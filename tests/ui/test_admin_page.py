"""The admin page in Chromium: a non-admin is turned away; an admin sees every session with its KV,
one session's KV figures, importance plot and retrieval events, can persist its KV, and sees the engine."""

import openai

from tests.chatsvc.conftest import MODEL
from tests.ui.conftest import ADMIN_PASSWORD, ALICE, log_in, screenshot

QUESTION = "Admin check: what is two plus two?"


def figure(page, label: str, panel: str = "#admin-kv") -> str:
    """The value shown above `label` in the session's KV figures (or another panel's)."""
    for stat in page.locator(f"{panel} .kv-stat").all():
        if stat.locator("span").inner_text() == label:
            return stat.locator("b").inner_text()
    raise AssertionError(f"no figure {label!r} in {page.locator(panel).inner_text()!r}")


def test_a_non_admin_cannot_open_the_admin_page(server, page):
    log_in(page, server.url, *ALICE, path="/admin")
    page.get_by_text("This page is for admins.").wait_for()
    screenshot(page, "admin-refused")
    assert not page.locator("#admin-content").is_visible()
    assert page.locator("#admin-sessions").count() == 0 or not page.locator("#admin-sessions").is_visible()


def test_an_admin_sees_a_session_with_its_kv(server, page):
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.user_keys["alice"], max_retries=0)
    api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=8)
    server.wait_idle()  # the turn's KV is recorded after the reply

    log_in(page, server.url, "admin", ADMIN_PASSWORD, path="/admin")
    page.locator("#admin-owner textarea, #admin-owner input").first.fill("alice")
    page.locator("#admin-refresh").click()
    row = page.locator("#admin-sessions").get_by_text(QUESTION).locator("visible=true").first
    row.wait_for()
    assert "alice" in page.locator("#admin-sessions").inner_text()
    row.click()
    page.locator("#admin-kv").get_by_text("tokens cached").wait_for()
    assert figure(page, "KV in") == "pool" and int(figure(page, "tokens cached")) > 0
    page.locator("#admin-importance").locator("canvas, svg").first.wait_for()
    page.locator("#kv-persist").click()
    page.get_by_text("persist done").wait_for()
    assert figure(page, "on disk") != "0 B"
    page.locator("#engine-figures").get_by_text("ready").wait_for()
    assert figure(page, "weights", "#engine-figures").endswith(" MB")
    assert figure(page, "KV pool", "#engine-figures").endswith(" tokens")
    screenshot(page, "admin-session")
    assert not page.script_errors
