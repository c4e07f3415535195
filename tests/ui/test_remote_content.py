"""Showing a message or a document loads nothing from another host: HTML from them comes back escaped
through the event API, a Markdown image from elsewhere is a link, the page in Chromium requests nothing but
this server, a toast shows a session's title as text, and the Content-Security-Policy keeps any image we
missed from loading.  The admin's switch lets web images load."""

from urllib.parse import urlsplit

import gradio_client
import openai
from playwright.sync_api import expect
from sqlalchemy import select
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from chatsvc import crud
from chatsvc.models import MessageStatus, User
from chatsvc.settings import settings_from_cli
from chatsvc.ui.content_policy import ContentSecurityPolicy, content_security_policy
from tests.chatsvc.conftest import MODEL
from tests.ui.conftest import ADMIN_PASSWORD, ALICE, chat_ready, log_in, screenshot

ELSEWHERE = "198.51.100.7"  # a documentation address: never reachable
BEACON = f"![x](http://{ELSEWHERE}/beacon.png)"
IMG = f'<img src="http://{ELSEWHERE}/x.png">'
HOSTILE = f"The Quillmoor ferry leaves at dawn. {IMG} <a href='http://{ELSEWHERE}/'>tickets</a> {BEACON}"


def texts(chat: list[dict]) -> list[str]:
    """The text of each message of a chatbot value as gradio_client returns it."""
    return ["".join(part.get("text") or "" for part in message["content"]) for message in chat]


def test_html_and_remote_images_come_back_escaped_through_the_event_api(server):
    key = server.user_keys["alice"]
    kb = server.rest("POST", "/api/knowledge-bases", key=key, json={"name": "Ferries"}).json()["id"]
    files = [("files", ("ferry.txt", HOSTILE.encode(), "text/plain"))]
    uploaded = server.rest("POST", f"/api/knowledge-bases/{kb}/documents", key=key, files=files).json()
    assert [d["name"] for d in uploaded["added"]] == ["ferry.txt"]

    client = gradio_client.Client(f"{server.url}/", auth=ALICE, verbose=False)
    client.predict(api_name="/loaded")  # as the page does: the knowledge bases become the dropdown's choices
    question = f"When does the Quillmoor ferry leave? {IMG} {BEACON}"
    chat = client.predict(question, "", kb, 0, api_name="/send")[0]
    shown = texts(chat)
    sources = [
        text
        for text, message in zip(shown, chat, strict=True)
        if (message["metadata"] or {}).get("parent_id")
    ]
    assert sources and "Quillmoor ferry leaves at dawn" in sources[0]
    for text in (shown[0], sources[0]):  # the question and the document's paragraph
        assert "<img" not in text and "![" not in text
        assert f'&lt;img src="http://{ELSEWHERE}/x.png">' in text
        assert f"[image&#58; x](http://{ELSEWHERE}/beacon.png)" in text
    assert "<a " not in sources[0]
    assert not any("<img" in text or "<a " in text for text in shown)


def store_hostile_conversation(server, title: str) -> None:
    """Alice's session whose question, reply, source text and source heading hold HTML and a remote image."""
    citation = {"n": 1, "title": "ferry.txt", "heading": BEACON, "text": HOSTILE, "cited": True}
    with server.service.db.begin() as db:
        alice = db.scalar(select(User).where(User.username == ALICE[0]))
        session = crud.create_session(db, alice.id, title=title)
        question = crud.add_message(db, session, None, "user", HOSTILE, status=MessageStatus.done)
        crud.add_message(
            db, session, question.id, "assistant", HOSTILE, status=MessageStatus.done, citations=[citation]
        )


def test_the_page_requests_nothing_from_another_host(server, page):
    title = "Ferry beacons"
    store_hostile_conversation(server, title)
    requested, responses = [], []
    page.on("request", lambda request: requested.append(request.url))
    page.on("response", lambda response: responses.append(response))
    log_in(page, server.url, *ALICE)
    chat_ready(page)
    page.locator("#session-sidebar").get_by_role("button", name=title).click()
    reply = page.locator("#chat .bot").filter(has_text="Quillmoor").first
    reply.wait_for()
    page.locator("#chat").get_by_text("Sources (").click()
    page.locator("#chat").get_by_text("[1] ferry.txt").click()
    beacon_links = page.locator(f"#chat a[href='http://{ELSEWHERE}/beacon.png']")
    expect(beacon_links.filter(has_text="image: x")).to_have_count(4)  # question, reply, source, its title
    expect(page.locator("#chat").get_by_text(IMG).first).to_be_visible()
    page.wait_for_timeout(500)  # an image starts loading as it enters the page; the events never go idle
    screenshot(page, "chat-remote-content")

    here = urlsplit(server.url).netloc
    # data: and blob: URLs have no host
    assert [url for url in requested if urlsplit(url).netloc not in (here, "")] == []
    assert page.locator("#chat img").count() == 0
    pages = [response for response in responses if response.request.resource_type == "document"]
    assert pages and all(
        response.headers.get("content-security-policy") == content_security_policy(False)
        for response in pages
    )
    assert not page.script_errors


def test_the_other_pages_request_nothing_from_another_host(server, page):
    requested = []
    page.on("request", lambda request: requested.append(request.url))
    log_in(page, server.url, "admin", ADMIN_PASSWORD, path="/admin")
    page.locator("#engine-figures").get_by_text("ready").wait_for()
    page.locator(".engine-plot").locator("canvas, svg").first.wait_for()
    page.goto(server.url + "/knowledge")
    page.locator("#kb-documents").wait_for()
    page.wait_for_timeout(500)
    here = urlsplit(server.url).netloc
    assert [url for url in requested if urlsplit(url).netloc not in (here, "")] == []


def test_the_content_security_policy_stops_an_image_from_another_host(server, page):
    log_in(page, server.url, *ALICE)
    chat_ready(page)
    blocked = page.evaluate(
        """url => new Promise(resolve => {
            document.addEventListener('securitypolicyviolation', event => resolve(event.blockedURI));
            setTimeout(() => resolve(null), 5000);
            const image = document.createElement('img');
            image.src = url;
            document.querySelector('#chat').appendChild(image);
        })""",
        f"http://{ELSEWHERE}/missed.png",
    )
    assert blocked == f"http://{ELSEWHERE}/missed.png"


def test_a_toast_shows_a_session_title_as_text(server, page):
    key = server.user_keys["alice"]
    session = server.rest("POST", "/api/sessions", key=key, json={"title": f"Toast {IMG}"}).json()
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        extra_body={"session_id": session["id"]},
    )
    server.wait_idle()  # the turn's KV is recorded after the reply

    log_in(page, server.url, "admin", ADMIN_PASSWORD, path="/admin")
    page.locator("#admin-title textarea, #admin-title input").first.fill("Toast")
    page.locator("#admin-refresh").click()
    page.locator("#admin-sessions").get_by_text("Toast").locator("visible=true").first.click()
    page.locator("#admin-kv").get_by_text("tokens cached").wait_for()
    page.locator("#kv-persist").click()
    toast = page.get_by_text("persist done")
    toast.wait_for()
    assert f"KV of 'Toast {IMG}': persist done." in toast.inner_text()
    assert page.locator("[data-testid=toast-body] img").count() == 0


def test_the_admins_switch_lets_web_images_load(monkeypatch):
    assert settings_from_cli([]).allow_remote_images is False
    assert settings_from_cli(["--allow-remote-images"]).allow_remote_images is True
    monkeypatch.setenv("KVCHAT_ALLOW_REMOTE_IMAGES", "true")
    assert settings_from_cli([]).allow_remote_images is True
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("page"))])
    for remote_images, sources in ((False, "'self' data: blob:"), (True, "'self' data: blob: http: https:")):
        policy = content_security_policy(remote_images)
        header = TestClient(ContentSecurityPolicy(app, policy)).get("/").headers["content-security-policy"]
        assert header == f"img-src {sources}; media-src 'self' data: blob:"


def test_the_server_sends_no_telemetry_to_gradio(server):
    ui = next(route.app for route in server.app.routes if hasattr(getattr(route, "app", None), "get_blocks"))
    assert ui.get_blocks().analytics_enabled is False
