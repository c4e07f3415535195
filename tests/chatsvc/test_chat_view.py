"""What the chatbot is given for stored messages and sources: HTML from a message or a document is shown as
text, an image from another host is a link unless the admin allows remote images, code stays as written,
and an edited message reads back as it was written."""

import pytest

from chatsvc.models import Message, MessageStatus
from chatsvc.ui.chat_view import conversation, shown_text, streaming, written_text

BEACON = "![x](http://198.51.100.7/beacon.png)"
HOSTILE_DOCUMENT = (
    'Opening hours. <img src="http://198.51.100.7/x.png"> <a href="http://198.51.100.7/">click</a> ' + BEACON
)


def reply_citing(text: str, title: str = "handbook.md", heading: str | None = None) -> Message:
    citation = {"n": 1, "title": title, "heading": heading, "text": text, "cited": True}
    return Message(
        id=2, role="assistant", content="See [1].", status=MessageStatus.done, citations=[citation]
    )


def chat_of(*messages: Message) -> list[dict]:
    return conversation([Message(id=1, role="user", content="Hi"), *messages]).messages


def source(chat: list[dict]) -> dict:
    """The one source box (inside the box of the reply's sources)."""
    return next(m for m in chat if m.get("metadata", {}).get("parent_id"))


def test_a_citation_shows_a_documents_html_as_text():
    content = source(chat_of(reply_citing(HOSTILE_DOCUMENT)))["content"]
    assert "<img" not in content and "<a " not in content
    assert '&lt;img src="http://198.51.100.7/x.png">' in content
    assert '&lt;a href="http://198.51.100.7/">click&lt;/a>' in content


def test_a_citation_title_shows_html_and_images_as_text():
    reply = reply_citing("text", title="<b>notes</b>.md", heading=BEACON)
    title = source(chat_of(reply))["metadata"]["title"]
    assert title == "[1] &lt;b>notes&lt;/b>.md › [image&#58; x](http://198.51.100.7/beacon.png)"


def test_a_replys_error_shows_html_and_images_as_text():
    failed = Message(id=2, role="assistant", content="", status=MessageStatus.error, error=HOSTILE_DOCUMENT)
    figures = chat_of(failed)[-1]["content"]
    assert "<img" not in figures and "<a " not in figures and "![" not in figures


@pytest.mark.parametrize(
    "image",
    [
        "![x](http://198.51.100.7/beacon.png)",
        "![x](HTTPS://198.51.100.7/beacon.png 'a title')",
        "![x](//198.51.100.7/beacon.png)",
        "![x]( \\/\\/198.51.100.7/beacon.png)",
        "![x](<http://198.51.100.7/beacon.png>)",
        "![x](data:image/png;base64,AAAA)",
        "![a\\](/ok)](http://198.51.100.7/beacon.png)",
        "![x][beacon]\n\n[beacon]: http://198.51.100.7/beacon.png",
    ],
)
def test_an_image_from_another_host_becomes_a_link(image):
    for shown in (
        source(chat_of(reply_citing(image)))["content"],
        chat_of(Message(id=2, role="assistant", content=image, status=MessageStatus.done))[1]["content"],
        streaming([], image, image)[0]["content"],
    ):
        assert "![" not in shown
        assert shown.startswith("[image&#58; ")


def test_an_image_of_this_server_stays_an_image():
    local = "![logo](/kvchat-static/logo.svg) ![relative](logo.svg 'title')"
    assert shown_text(local) == local


def test_remote_images_allowed_keep_web_images_only():
    web = "![x](http://198.51.100.7/beacon.png) ![y](//198.51.100.7/y.png) ![z](/kvchat-static/logo.svg)"
    assert shown_text(web, remote_images=True) == web
    chat = conversation([reply_citing(BEACON)], remote_images=True).messages
    assert source(chat)["content"] == BEACON
    assert shown_text("![x](data:image/png;base64,AAAA)", remote_images=True).startswith("[image&#58; ")


def test_code_is_left_as_written():
    code = (
        "Use `<img src=http://198.51.100.7/x.png>` or `![x](http://198.51.100.7/x.png)` or ``a`<b>``:\n"
        '```html\n<img src="http://198.51.100.7/x.png">\n![x](http://198.51.100.7/x.png)\n```\n'
        "~~~\n<b>bold</b>\n~~~"
    )
    assert shown_text(code) == code


@pytest.mark.parametrize(
    "text",
    [
        "\\`<img src=http://198.51.100.7/x.png>`",  # an escaped backtick opens no code span
        "``<img src=http://198.51.100.7/x.png>`",  # nor does a run of two closed by one
        "```x`\n<img src=http://198.51.100.7/x.png>\n```",  # an info string with a backtick opens no block
        "a ```\n\n<img src=http://198.51.100.7/x.png>\n\n```",  # nor does a fence inside a line
        "$$`$$ <img src=http://198.51.100.7/x.png>`",  # LaTeX is taken out before Markdown pairs backticks
    ],
)
def test_html_that_markdown_does_not_take_for_code_is_escaped(text):
    assert "<img" not in shown_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "a <b> & c &lt; d",
        BEACON + " and ![y](/kvchat-static/logo.svg)",
        "[image&#58; not ours](http://198.51.100.7/) `<code> & ![x](http://198.51.100.7/x.png)`",
        HOSTILE_DOCUMENT,
    ],
)
def test_an_edited_message_reads_back_as_written(text):
    assert written_text(shown_text(text)) == text
