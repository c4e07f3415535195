"""Where retrieved sources come from.  The retriever plugs in here; until it does, turns carry none."""

from dataclasses import dataclass, field
from typing import Protocol

from chatsvc.models import ChatSession


@dataclass
class Source:
    title: str
    text: str
    ref: dict = field(default_factory=dict)  # where it came from (document, paragraph), shown with citations


class ContextProvider(Protocol):
    async def build_context(self, query: str, session: ChatSession) -> list[Source]:
        """Sources for this turn's question, best first (they are numbered from 1 in the prompt).

        `session.knowledge_base_id` names the attached knowledge base (collection f"kb:{id}"), if any."""
        ...


class NoContext:
    async def build_context(self, query: str, session: ChatSession) -> list[Source]:
        return []


def numbered(sources: list[Source]) -> list[dict]:
    """The form stored with the user message, so that later prompts repeat it verbatim."""
    return [{"n": n, "title": s.title, "text": s.text, "ref": s.ref} for n, s in enumerate(sources, start=1)]


def citations(context: list[dict], reply: str) -> list[dict]:
    return [
        {
            "n": source["n"],
            "title": source["title"],
            "ref": source["ref"],
            "cited": f"[{source['n']}]" in reply,
        }
        for source in context
    ]
