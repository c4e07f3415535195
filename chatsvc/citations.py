"""Retrieved sources as a turn carries them: numbered from 1 inside its user message, cited by the reply."""

import re
import unicodedata
from dataclasses import dataclass, field

# [1], [1, 2], [1][2], and the forms a model writes in Chinese: 【1】, 【1，2】, 【1、2】, ［１］ (full-width
# brackets, digits and commas become ASCII under NFKC; 【】 and 、 stay as they are).
CITATION = re.compile(r"[\[【]\s*(\d+(?:\s*[,、]\s*\d+)*)\s*[\]】]")


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


def cited_numbers(reply: str) -> set[int]:
    """The source numbers a reply cites, in any of the marker styles above."""
    found = set()
    for match in CITATION.finditer(unicodedata.normalize("NFKC", reply)):
        found.update(int(number) for number in re.split(r"\s*[,、]\s*", match.group(1)))
    return found


def citations(context: list[dict], reply: str) -> list[dict]:
    """Every source of the turn, numbered as in the prompt, with whether the reply cites it."""
    cited = cited_numbers(reply)
    return [
        {
            "n": source["n"],
            "title": source["title"],
            **source["ref"],
            "text": source["text"],
            "cited": source["n"] in cited,
        }
        for source in context
    ]
