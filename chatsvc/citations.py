"""Retrieved sources as a turn carries them: numbered from 1 inside its user message, cited by the reply."""

from dataclasses import dataclass, field


@dataclass
class Source:
    title: str
    text: str
    ref: dict = field(default_factory=dict)  # where it came from (document, paragraphs), shown with citations


@dataclass
class FoundSources:
    sources: list[Source]
    intent: str
    details: dict  # how the sources were chosen (intent, window, latency), stored with the user message
    latency_s: float


def numbered(sources: list[Source]) -> list[dict]:
    """The form stored with the user message, so that later prompts repeat it verbatim."""
    return [{"n": n, "title": s.title, "text": s.text, "ref": s.ref} for n, s in enumerate(sources, start=1)]


def citations(context: list[dict], reply: str) -> list[dict]:
    """Every source of the turn, numbered as in the prompt, with whether the reply cites it as [n]."""
    return [
        {
            "n": source["n"],
            "title": source["title"],
            **source["ref"],
            "text": source["text"],
            "cited": f"[{source['n']}]" in reply,
        }
        for source in context
    ]
