"""While the model loads, the chat page says so and keeps what the user wrote; if loading fails, it says so.
The engine's loading is held back (and then failed) by gating the one function that builds it."""

import threading

import pytest

from chatsvc import engines
from tests.chatsvc.conftest import wait_healthy
from tests.ui.conftest import ALICE, UiServer, chat_ready, log_in, screenshot


@pytest.fixture
def loading_server(tmp_path, smollm2_dir, monkeypatch):
    release = threading.Event()

    def slow_then_failing_build(settings):
        release.wait(timeout=120)
        raise RuntimeError("the test stopped this load")

    monkeypatch.setattr(engines, "build_engine", slow_then_failing_build)
    live = UiServer(tmp_path, smollm2_dir)
    live.start()
    live.add_user(*ALICE)
    yield live, release
    release.set()
    live.stop()


def test_the_page_says_the_model_is_loading_and_keeps_the_message(loading_server, page):
    live, release = loading_server
    log_in(page, live.url, *ALICE)
    chat_ready(page)
    notice = page.locator("#engine-notice")
    assert "The model is loading" in notice.inner_text()

    page.locator("#message textarea").fill("Are you there?")
    page.locator("#send").click()
    page.get_by_text("the model is still loading").first.wait_for()
    assert page.locator("#message textarea").input_value() == "Are you there?"  # nothing lost
    assert live.rest("GET", "/api/sessions", key=live.user_keys["alice"]).json()["count"] == 0
    screenshot(page, "loading")

    release.set()  # the load now fails: the page's timer picks that up
    page.get_by_text("The model could not be loaded").wait_for(timeout=15_000)
    with pytest.raises(TimeoutError):
        wait_healthy(live.url, timeout_s=1)
    assert not page.script_errors
