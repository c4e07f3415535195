"""The chat page in Chromium against the live server: log in, a streamed answer, Stop, regenerate, edit,
switching and managing sessions, and message text that must never run as HTML."""

import re

import openai
from playwright.sync_api import expect

from tests.chatsvc.conftest import MODEL
from tests.ui.conftest import (
    ALICE,
    chat_ready,
    log_in,
    screenshot,
    send,
    set_temperature,
    wait_reply,
)

STORY = "Write a long story about a dragon who learns to bake bread."


def alice_sessions(server, q: str | None = None) -> list[dict]:
    params = {"q": q} if q else {}
    return server.rest("GET", "/api/sessions", key=server.user_keys["alice"], params=params).json()["data"]


def alice_messages(server, session_id: str) -> list[dict]:
    return server.rest("GET", f"/api/sessions/{session_id}/messages", key=server.user_keys["alice"]).json()[
        "data"
    ]


def open_chat(server, page) -> None:
    log_in(page, server.url, *ALICE)
    chat_ready(page)


def record_reply_texts(page) -> None:
    """Every text the last reply shows, as the page renders it: polling from here missed a fast stream."""
    page.evaluate(
        """() => {
            window.__replies = [];
            new MutationObserver(() => {
                const bots = document.querySelectorAll('#chat .bot');
                if (bots.length) window.__replies.push(bots[bots.length - 1].innerText.trim());
            }).observe(
                document.querySelector('#chat'), {childList: true, subtree: true, characterData: true}
            );
        }"""
    )


def test_log_in_and_see_a_streamed_answer(server, page):
    open_chat(server, page)
    set_temperature(page, 0)
    record_reply_texts(page)
    send(page, "Tell me about Paris, the capital of France.")
    wait_reply(page)
    seen = page.evaluate("window.__replies")
    screenshot(page, "chat-answer")

    reply = page.locator("#chat .bot").last
    assert "Paris" in reply.inner_text()
    figures = reply.get_by_text("s to first token")
    assert "tokens/s" in figures.inner_text() and "prompt tokens" in figures.inner_text()
    stored = alice_messages(server, alice_sessions(server, "Tell me about Paris")[0]["id"])[-1]
    assert stored["status"] == "done" and stored["content"][:20] in reply.inner_text()
    growing = {text for text in seen if text and text != "…" and len(text) < len(stored["content"])}
    assert len(growing) >= 2, f"the reply did not stream: saw {seen}"
    assert page.locator("#session-sidebar").get_by_text("Tell me about Paris").count() == 1
    assert not page.script_errors


def test_stop_keeps_the_partial_reply(server, page):
    open_chat(server, page)
    send(page, STORY)
    page.wait_for_function(
        "() => { const b = document.querySelectorAll('#chat .bot'); "
        "return b.length && b[b.length - 1].innerText.split(' ').length >= 3; }",
        timeout=60_000,
    )
    page.locator("#stop").click()
    wait_reply(page)
    page.locator("#chat .bot").last.get_by_text("Stopped").wait_for()
    screenshot(page, "chat-stopped")

    reply = alice_messages(server, alice_sessions(server, STORY)[0]["id"])[-1]
    assert reply["status"] == "aborted" and reply["finish_reason"] == "abort"
    assert reply["content"] and reply["completion_tokens"] < 40
    assert reply["content"][:20] in page.locator("#chat .bot").last.inner_text()


def test_regenerate_and_edit_make_branches(server, page):
    open_chat(server, page)
    send(page, "Name a colour.")
    wait_reply(page)
    page.locator("#chat").get_by_label("Retry").last.click()
    page.locator("#stop").wait_for(state="visible")
    wait_reply(page)
    session = alice_sessions(server, "Name a colour.")[0]
    messages = alice_messages(server, session["id"])
    question, *replies = messages
    assert [m["parent_id"] for m in replies] == [question["id"], question["id"]]
    assert all(m["status"] == "done" for m in replies)

    page.locator("#chat .user").last.hover()
    page.locator("#chat").get_by_label("Edit").last.click()
    page.locator("#chat textarea").last.fill("Name a fruit.")
    page.locator("#chat").get_by_role("button", name="Submit").click()
    page.locator("#stop").wait_for(state="visible")
    wait_reply(page)
    screenshot(page, "chat-edited")
    messages = alice_messages(server, session["id"])
    edited = [m for m in messages if m["role"] == "user"]
    assert [m["content"] for m in edited] == ["Name a colour.", "Name a fruit."]
    assert edited[1]["parent_id"] is None  # beside the original, not after it
    assert messages[-1]["parent_id"] == edited[1]["id"] and messages[-1]["status"] == "done"
    assert "Name a fruit." in page.locator("#chat").inner_text()
    assert "Name a colour." not in page.locator("#chat").inner_text()


CLICK_AFTER_SHOWN = """([shown, next, delay_ms]) => {
    const chat = document.querySelector('#chat');
    new MutationObserver((_, observer) => {
        if (!chat.innerText.includes(shown)) return;
        observer.disconnect();
        const entry = [...document.querySelectorAll('#session-sidebar button')].find(
            b => b.innerText.trim() === next);
        setTimeout(() => entry.click(), delay_ms);
    }).observe(chat, {childList: true, subtree: true, characterData: true});
}"""


def test_a_chat_opens_when_clicked_while_the_sidebar_re_renders(server, page):
    """Opening a chat re-renders the sidebar.  A click on a button of the render before, landing after the
    server re-rendered (here: 10-200 ms after the chat before shows, on a CPU slowed 4x), must still open
    its chat.  It did not when each render gave the buttons' events new ids: the click was lost."""
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.user_keys["alice"], max_retries=0)
    titles = ["Foxes: why red?", "Moles: why blind?", "Bats: why upside down?"]
    for question in titles:
        api.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=4
        )
    open_chat(server, page)
    page.context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate", {"rate": 4})
    sidebar = page.locator("#session-sidebar")
    # Each round shows a chat other than the open one, then the click lands on the third.
    for i, delay_ms in enumerate((10, 30, 60, 100, 150, 200)):
        shown, clicked = titles[2 * i % 3], titles[(2 * i + 1) % 3]
        page.evaluate(CLICK_AFTER_SHOWN, [shown, clicked, delay_ms])
        sidebar.get_by_role("button", name=shown).click()
        page.locator("#chat").get_by_text(clicked).wait_for(timeout=15_000)
        assert shown not in page.locator("#chat").inner_text()
    assert page.script_errors == []


def test_switch_search_rename_and_delete_sessions(server, page):
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.user_keys["alice"], max_retries=0)
    for question in ("Zebras: why stripes?", "Owls: why at night?"):
        api.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=4
        )
    open_chat(server, page)
    sidebar = page.locator("#session-sidebar")
    sidebar.get_by_role("button", name="Zebras: why stripes?").click()
    page.locator("#chat").get_by_text("Zebras: why stripes?").wait_for()
    sidebar.get_by_role("button", name="Owls: why at night?").click()
    page.locator("#chat").get_by_text("Owls: why at night?").wait_for()
    assert "Zebras" not in page.locator("#chat").inner_text()

    page.locator("#session-search textarea, #session-search input").first.fill("zebras")
    page.wait_for_function("() => !document.querySelector('#session-sidebar').innerText.includes('Owls')")
    assert sidebar.get_by_role("button", name="Zebras: why stripes?").is_visible()
    page.locator("#session-search textarea, #session-search input").first.fill("")
    sidebar.get_by_role("button", name="Owls: why at night?").wait_for()

    page.locator("#chat-manage").get_by_text("This chat").click()
    title = page.locator("#chat-title textarea, #chat-title input").first
    expect(title).to_have_value(re.compile("^Owls"))
    # The sidebar's re-render after the search can land after the list shows, and put the open chat's title
    # back into the box: type until the new one stays.
    for _ in range(10):
        title.fill("Night birds")
        page.wait_for_timeout(500)
        if title.input_value() == "Night birds":
            break
    page.locator("#rename-chat").click()
    sidebar.get_by_role("button", name="Night birds").wait_for()
    page.locator("#delete-chat").click()
    page.locator("#confirm-delete").click()
    page.wait_for_function(
        "() => !document.querySelector('#session-sidebar').innerText.includes('Night birds')"
    )
    screenshot(page, "chat-sessions")
    assert alice_sessions(server, "Owls") == [] and len(alice_sessions(server, "Zebras")) == 1


def test_html_in_messages_is_shown_as_text_and_never_runs(server, page):
    open_chat(server, page)
    attack = '<script>window.__xss = "script"</script> <img src=x onerror="window.__xss = \'img\'"> Say hi.'
    send(page, attack)
    wait_reply(page)
    page.reload()
    chat_ready(page)
    page.locator("#session-sidebar").get_by_role("button", name="<script>").first.click()
    page.locator("#chat").get_by_text("<script>", exact=False).first.wait_for()
    screenshot(page, "chat-html-as-text")
    assert page.evaluate("window.__xss") is None
    assert page.locator("#chat script, #chat img[src='x']").count() == 0
    assert "<img src=x onerror=" in page.locator("#chat .user").last.inner_text()
    assert not page.script_errors


COMPOSING_ENTER = """el => {
    for (const type of ['keydown', 'keypress']) {
        el.dispatchEvent(new KeyboardEvent(type, {
            key: 'Enter', code: 'Enter', shiftKey: true, isComposing: true, keyCode: 229,
            bubbles: true, cancelable: true,
        }));
    }
}"""


RETURNS = """# 退货政策

## 无理由退货

商品签收后七天内，包装完好、配件齐全的，可以申请无理由退货，运费由买家承担。

## 退款到账

退款按原支付方式退回：支付宝一至三个工作日到账，银行卡三至七个工作日到账。
""".encode()


def chinese_knowledge_base(server) -> None:
    key = server.user_keys["alice"]
    kb = server.rest("POST", "/api/knowledge-bases", key=key, json={"name": "售后政策"}).json()["id"]
    files = [("files", ("退货政策.md", RETURNS, "text/markdown"))]
    added = server.rest("POST", f"/api/knowledge-bases/{kb}/documents", key=key, files=files)
    assert added.status_code == 200, added.text


def test_a_chinese_question_composed_with_an_input_method_gets_its_answer_and_sources(server, page):
    """Shift+Enter sends from the two-line box; the same keys while an input method composes (choosing a
    Chinese candidate) must not.  The answer streams in whole characters, with its Chinese source."""
    chinese_knowledge_base(server)
    open_chat(server, page)
    set_temperature(page, 0)
    page.locator("#knowledge-base input").click()
    page.get_by_role("option", name="售后政策").click()
    box = page.locator("#message textarea")
    box.fill("退款多久能到我的支付宝？")
    box.evaluate(COMPOSING_ENTER)
    page.wait_for_timeout(1500)
    expect(page.locator("#stop")).to_be_hidden()
    assert box.input_value() == "退款多久能到我的支付宝？"
    box.press("Shift+Enter")
    page.locator("#stop").wait_for(state="visible")
    wait_reply(page)
    reply = page.locator("#chat .bot").last
    assert "\ufffd" not in reply.inner_text()  # no character cut between two streamed pieces
    reply.get_by_text("Sources (").click()
    paragraph = reply.get_by_text("支付宝一至三个工作日到账").filter(visible=True)
    shown_before = paragraph.count()
    reply.get_by_text("[1] 退货政策.md").click()
    expect(paragraph).to_have_count(shown_before + 1)
    screenshot(page, "chat-chinese-citation")
