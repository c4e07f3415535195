"""A live server with the whole app (UI, API, real SmolLM2), Debian's Chromium under Playwright, and helpers
that act on the pages as a user would.  Screenshots go to test-artifacts/ui/."""

import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from tests.chatsvc.conftest import ADMIN_KEY, server_settings, wait_healthy

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui"
ADMIN_PASSWORD = "admin-password-1"
ALICE = ("alice", "alice-password-1")
REPLY_TIMEOUT_MS = 120_000


class UiServer:
    """The app under uvicorn in a thread; `url` answers at once, while the model is still loading."""

    def __init__(self, data_dir: Path, model_dir: Path):
        from app import build_app

        settings = server_settings(
            data_dir, model_dir, admin_password=ADMIN_PASSWORD, default_max_tokens=40, kv_cache_gb=0.5
        )
        self.app = build_app(settings)
        self.data_dir = settings.data_path()
        self.url = f"http://127.0.0.1:{settings.port}"
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=settings.port, log_level="warning", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.user_keys: dict[str, str] = {}

    @property
    def service(self):
        return self.app.state.service

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def rest(self, method: str, path: str, key: str = ADMIN_KEY, **kwargs) -> httpx.Response:
        return httpx.request(
            method, f"{self.url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=60, **kwargs
        )

    def add_user(self, username: str, password: str) -> None:
        created = self.rest("POST", "/api/admin/users", json={"username": username, "password": password})
        assert created.status_code == 201, created.text
        self.user_keys[username] = created.json()["api_key"]

    def wait_idle(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while self.service.turns.busy_sessions or self.service.turns.after_turns:
            assert time.monotonic() < deadline, "replies still generating"
            time.sleep(0.05)


@pytest.fixture(scope="session")
def starting_server(tmp_path_factory, smollm2_dir):
    """Yields as soon as the server answers: the model may still be loading (the first test looks)."""
    live = UiServer(tmp_path_factory.mktemp("ui"), smollm2_dir)
    live.start()
    live.add_user(*ALICE)
    yield live
    live.stop()


@pytest.fixture
def server(starting_server) -> UiServer:
    wait_healthy(starting_server.url)
    starting_server.wait_idle()
    return starting_server


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("UI tests skipped: Debian's chromium is not installed (make browser installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A fresh browser context (no login yet), with errors in the page's scripts collected."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    opened.script_errors = []
    opened.on("pageerror", lambda error: opened.script_errors.append(str(error)))
    yield opened
    context.close()


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def log_in(page, url: str, username: str, password: str, path: str = "/") -> None:
    page.goto(url + path)
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.locator(".gradio-container").first.wait_for()


def chat_ready(page) -> None:
    """The chat page has loaded its user's sessions."""
    page.locator("#session-sidebar .user-line").get_by_text("Signed in as").wait_for()


def set_temperature(page, value: float) -> None:
    page.locator("#session-options").get_by_text("Session options").click()
    number = page.locator("#temperature input[type=number]")
    number.fill(str(value))
    number.press("Enter")


def send(page, text: str) -> None:
    page.locator("#message textarea").fill(text)
    page.locator("#send").click()
    page.locator("#stop").wait_for(state="visible")


def wait_reply(page) -> None:
    """Until the reply is stored and shown with its figures (Send comes back)."""
    page.locator("#send").wait_for(state="visible", timeout=REPLY_TIMEOUT_MS)
