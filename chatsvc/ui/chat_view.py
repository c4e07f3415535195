"""What the chat page shows for a stored conversation: the chatbot's messages, the sources under a reply and
its figures.  Text from messages and documents is shown as written: HTML in it is escaped (outside code,
which Markdown already shows literally), so no tag, script or remote image from it reaches the page; the
Chatbot's own sanitizer is a second guard."""

import re
from dataclasses import dataclass, field

from chatsvc.models import UNFINISHED, Message, MessageStatus

# Fenced blocks (also one still open while a reply streams) and inline code spans.
CODE = re.compile(r"(```.*?(?:```|\Z)|~~~.*?(?:~~~|\Z)|`[^`\n]+`)", re.DOTALL)
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


def shown_text(text: str) -> str:
    """Markdown stays Markdown; `<` and `&` outside code are escaped, so HTML shows as the text it is."""
    parts = CODE.split(text)
    return "".join(part if index % 2 else _escape(part) for index, part in enumerate(parts))


def written_text(shown: str) -> str:
    """The text behind `shown_text` (what the page hands back when a message is edited)."""
    parts = CODE.split(shown)
    return "".join(
        part if index % 2 else part.replace("&lt;", "<").replace("&amp;", "&")
        for index, part in enumerate(parts)
    )


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;")


def conversation(branch: list[Message]) -> ChatView:
    view = ChatView()
    for message in branch:
        if message.role == "user":
            view.add({"role": "user", "content": shown_text(message.content)}, message.id)
        elif message.role == "assistant":
            add_reply(view, message)
    return view


def add_reply(view: ChatView, reply: Message) -> None:
    text = shown_text(reply.content) or ("…" if reply.status in UNFINISHED else "")
    view.add({"role": "assistant", "content": text}, reply.id)
    if reply.citations:
        add_sources(view, reply)
    if reply.status not in UNFINISHED:
        view.add({"role": "assistant", "content": figures_detail(reply), "metadata": figures_box(reply)})


def add_sources(view: ChatView, reply: Message) -> None:
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
                "content": citation.get("text") or "",
                "metadata": source_box(citation, group),
            }
        )


def source_box(citation: dict, group: str) -> dict:
    title = f"[{citation['n']}] {citation.get('title') or 'source'}"
    if citation.get("heading"):
        title += f" › {citation['heading']}"
    title = _escape(title)
    box = {"title": title, "parent_id": group, "status": "done"}
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
        lines.append(f"Error: {reply.error}")
    return "\n\n".join(lines)


def streaming(before: list[dict], question: str | None, reply_text: str) -> list[dict]:
    """The page while a reply streams: the conversation so far, the new question, the reply as it grows."""
    shown = list(before)
    if question is not None:
        shown.append({"role": "user", "content": shown_text(question)})
    shown.append({"role": "assistant", "content": shown_text(reply_text) or "…"})
    return shown
