"""What the chat page shows for a stored conversation: the chatbot's messages, the sources under a reply and
its figures.  Text from messages and documents is shown as written: HTML in it is escaped (outside code,
which Markdown already shows literally), so no tag or script from it reaches the page, and a Markdown image
from another host becomes a link to it, so that showing a message or a document loads nothing from elsewhere
(unless the admin allows remote images).  The Chatbot's own sanitizer and the pages' Content-Security-Policy
are second guards."""

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from chatsvc.models import UNFINISHED, Message, MessageStatus

# The Chatbot takes `$$...$$` out for LaTeX before marked reads the rest: backticks inside pair with nothing.
LATEX = re.compile(r"\$\$[\s\S]+?\$\$")
# What marked shows literally: a fenced block from a line's start (also one still open while a reply streams;
# an info string with a backtick opens no block), and a code span within a line, closed by a run of as many
# backticks as opened it (an escaped backtick opens none).  Where this and marked disagree, this must see less
# code, never more: text it takes for code reaches marked unescaped.
CODE = re.compile(
    r"^ {0,3}(?P<fence>`{3,}(?=[^`\n]*$)|~{3,}).*?(?:\n {0,3}(?P=fence)[`~]*[ \t]*$|\Z)"
    r"|(?<![`\\])(?P<ticks>`+)(?!`)[^\n]+?(?<!`)(?P=ticks)(?!`)",
    re.MULTILINE | re.DOTALL,
)
IMAGE = re.compile(r"!\[")
IMAGE_UP_TO_SOURCE = r"!\[(?:[^\[\]\\]|\\.)*\]\(\s*+"  # `\s*+`: the spaces before a source never end it
# Sources a browser reads as a path on this server: no scheme (no colon), no `//host`, nothing escaped.
LOCAL_IMAGE = re.compile(IMAGE_UP_TO_SOURCE + r"(?!//)[^\s()\[\]:\\]*[\s)]")
WEB_IMAGE = re.compile(IMAGE_UP_TO_SOURCE + r"(?:https?:)?//[^\s()\[\]\\]*[\s)]", re.IGNORECASE)
# What `![` of an image that must not load becomes: a link showing "image: alt".  The colon is written as an
# entity, which nothing else in shown text can hold (every `&` of the text is escaped), so it reads back.
IMAGE_LINK = "[image&#58; "
ENDINGS = {
    MessageStatus.aborted: "Stopped",
    MessageStatus.interrupted: "Interrupted: the server stopped while writing this reply",
    MessageStatus.error: "Failed",
}


@dataclass
class ChatView:
    """The chatbot's messages and, beside each, the stored message it shows (None for source and figure
    boxes), so that an edit or a retry on the page finds its message."""

    messages: list[dict] = field(default_factory=list)
    message_ids: list[int | None] = field(default_factory=list)

    def add(self, shown: dict, message_id: int | None = None) -> None:
        self.messages.append(shown)
        self.message_ids.append(message_id)

    def reply_after(self, index: int) -> int:
        """The stored reply to the user message shown at `index`."""
        for message_id, shown in zip(self.message_ids[index + 1 :], self.messages[index + 1 :], strict=True):
            if message_id is not None and shown["role"] == "assistant":
                return message_id
        raise ValueError("this message has no reply to regenerate yet")

    def message_at(self, index: int) -> int:
        if not 0 <= index < len(self.message_ids) or self.message_ids[index] is None:
            raise ValueError("that message is not stored; reload the page")
        return self.message_ids[index]


def shown_text(text: str, remote_images: bool = False) -> str:
    """Markdown stays Markdown; `<` and `&` outside code are escaped, so HTML shows as the text it is, and an
    image from another host is a link (an image from the web stays one where `remote_images` allows it)."""
    return _outside_code(text, lambda part: _unloaded_images(_escape(part), remote_images))


def written_text(shown: str) -> str:
    """The text behind `shown_text` (what the page hands back when a message is edited)."""
    return _outside_code(
        shown, lambda part: part.replace(IMAGE_LINK, "![").replace("&lt;", "<").replace("&amp;", "&")
    )


def _outside_code(text: str, change: Callable[[str], str]) -> str:
    masked = LATEX.sub(lambda latex: "%" * len(latex[0]), text)  # what marked reads, at the same offsets
    parts, end = [], 0
    for code in CODE.finditer(masked):
        parts += [change(text[end : code.start()]), text[code.start() : code.end()]]
        end = code.end()
    parts.append(change(text[end:]))
    return "".join(parts)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;")


def _unloaded_images(text: str, remote_images: bool) -> str:
    """Every `![` that does not open an image whose source may load opens a link instead (also in broken or
    reference-style images: what may load is decided only where the source is plain to see)."""
    may_load = (LOCAL_IMAGE, WEB_IMAGE) if remote_images else (LOCAL_IMAGE,)

    def opening(image: re.Match) -> str:
        return image[0] if any(kind.match(text, image.start()) for kind in may_load) else IMAGE_LINK

    return IMAGE.sub(opening, text)


def conversation(branch: list[Message], remote_images: bool = False) -> ChatView:
    view = ChatView()
    for message in branch:
        if message.role == "user":
            view.add({"role": "user", "content": shown_text(message.content, remote_images)}, message.id)
        elif message.role == "assistant":
            add_reply(view, message, remote_images)
    return view


def add_reply(view: ChatView, reply: Message, remote_images: bool = False) -> None:
    text = shown_text(reply.content, remote_images) or ("…" if reply.status in UNFINISHED else "")
    view.add({"role": "assistant", "content": text}, reply.id)
    if reply.citations:
        add_sources(view, reply, remote_images)
    if reply.status not in UNFINISHED:
        view.add({"role": "assistant", "content": figures_detail(reply), "metadata": figures_box(reply)})


def add_sources(view: ChatView, reply: Message, remote_images: bool = False) -> None:
    """A closed box of the sources the reply was given, one box inside per source holding its paragraphs."""
    group = f"sources-{reply.id}"
    cited = sum(1 for citation in reply.citations if citation.get("cited"))
    summary = f"{cited} cited" if cited else "none cited by number"
    view.add(
        {
            "role": "assistant",
            "content": "",
            "metadata": {
                "title": f"Sources ({len(reply.citations)})",
                "id": group,
                "log": summary,
                "status": "done",
            },
        }
    )
    for citation in reply.citations:
        view.add(
            {
                "role": "assistant",
                "content": shown_text(citation.get("text") or "", remote_images),
                "metadata": source_box(citation, group, remote_images),
            }
        )


def source_box(citation: dict, group: str, remote_images: bool = False) -> dict:
    """The box's title, shown as Markdown too: the document's name and the paragraph's heading."""
    title = f"[{citation['n']}] {citation.get('title') or 'source'}"
    if citation.get("heading"):
        title += f" › {citation['heading']}"
    box = {"title": shown_text(title, remote_images), "parent_id": group, "status": "done"}
    if citation.get("cited"):
        box["log"] = "cited"
    return box


def figures_box(reply: Message) -> dict:
    """The figures of a finished reply, as the title of a closed box (the detail is inside)."""
    parts = []
    if reply.status in ENDINGS:
        parts.append(ENDINGS[reply.status])
    if reply.ttft_seconds is not None:
        parts.append(f"{reply.ttft_seconds:.2f} s to first token")
    if reply.tokens_per_second is not None:
        parts.append(f"{reply.tokens_per_second:.1f} tokens/s")
    if reply.draft_tokens:
        parts.append(f"{reply.accepted_tokens or 0} of {reply.draft_tokens} drafted tokens accepted")
    if reply.prompt_tokens:
        parts.append(f"{reply.prompt_tokens} prompt tokens, {reply.cached_tokens or 0} reused")
    return {"title": " · ".join(parts) or "No figures", "status": "done"}


def figures_detail(reply: Message) -> str:
    lines = [
        f"Prompt: {reply.prompt_tokens or 0} tokens, {reply.cached_tokens or 0} of them reused from the "
        "session's KV or the prefix cache.",
        f"Reply: {reply.completion_tokens or 0} tokens; ended: {reply.finish_reason or reply.status.value}.",
    ]
    if reply.error:
        lines.append(f"Error: {shown_text(reply.error)}")
    return "\n\n".join(lines)


def streaming(
    before: list[dict], question: str | None, reply_text: str, remote_images: bool = False
) -> list[dict]:
    """The page while a reply streams: the conversation so far, the new question, the reply as it grows."""
    shown = list(before)
    if question is not None:
        shown.append({"role": "user", "content": shown_text(question, remote_images)})
    shown.append({"role": "assistant", "content": shown_text(reply_text, remote_images) or "…"})
    return shown
