"""Document -> sections (headings) -> paragraphs (blank lines, topic shifts) -> sentences.

Input is Markdown-like text (ingestion turns HTML headings into `#` lines).  A block between blank lines is
a paragraph unless it is too long: then it is cut between sentences where the vocabulary shifts most
(TextTiling's idea: low word overlap between the sentences before and after a gap marks a topic change).
"""

import math
import re
from collections import Counter
from dataclasses import dataclass, field

from memory.retrieval.tokenize import term_counts

MAX_PARAGRAPH_SIZE = 180  # words, counting each CJK character as one
MIN_PARAGRAPH_SIZE = 40
COHESION_WINDOW = 2  # sentences compared on each side of a gap

_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_SIZE_UNITS = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]|[^\W_]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)|(?<=[。！？；])\s*(?=\S)")


@dataclass
class Section:
    title: str
    level: int  # 0 is the document itself
    parent: int | None  # index in Segmentation.sections


@dataclass
class Paragraph:
    text: str
    section: int  # index in Segmentation.sections
    sentence_ends: list[int]  # character offsets in text where each sentence ends


@dataclass
class Segmentation:
    sections: list[Section] = field(default_factory=lambda: [Section("", 0, None)])
    paragraphs: list[Paragraph] = field(default_factory=list)

    def section_path(self, index: int) -> str:
        titles = []
        section: int | None = index
        while section is not None:
            titles.append(self.sections[section].title)
            section = self.sections[section].parent
        return " > ".join(title for title in reversed(titles) if title)


def text_size(text: str) -> int:
    return len(_SIZE_UNITS.findall(text))


def segment(text: str) -> Segmentation:
    result = Segmentation()
    current = 0
    block: list[str] = []
    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading or not line.strip():
            _add_block(result, current, block)
            block = []
        if heading:
            current = _open_section(result, current, len(heading.group(1)), heading.group(2))
        elif line.strip():
            block.append(line.rstrip())
    _add_block(result, current, block)
    return result


def _open_section(result: Segmentation, current: int, level: int, title: str) -> int:
    parent = current
    while result.sections[parent].level >= level:
        parent = result.sections[parent].parent
    result.sections.append(Section(title, level, parent))
    return len(result.sections) - 1


def _add_block(result: Segmentation, section: int, lines: list[str]) -> None:
    if not lines:
        return
    block = "\n".join(lines)
    for spans in _split_at_topic_shifts(block, sentence_spans(block)):
        start = spans[0][0]
        ends = [end - start for _, end in spans]
        result.paragraphs.append(Paragraph(block[start : spans[-1][1]], section, ends))


Span = tuple[int, int]


def sentence_spans(text: str) -> list[Span]:
    spans, start = [], 0
    for boundary in [*_SENTENCE_END.finditer(text), None]:
        end = boundary.start() if boundary else len(text)
        if text[start:end].strip():
            spans.extend(_split_oversized(text, (start, end)))
        start = boundary.end() if boundary else end
    return spans


def _split_oversized(text: str, span: Span) -> list[Span]:
    """A 'sentence' without punctuation (e.g. extracted from a PDF) is cut into chunks of words."""
    if text_size(text[span[0] : span[1]]) <= MAX_PARAGRAPH_SIZE:
        return [span]
    units = [match.span() for match in _SIZE_UNITS.finditer(text, span[0], span[1])]
    step = MAX_PARAGRAPH_SIZE // 2
    return [(units[i][0], units[min(i + step, len(units)) - 1][1]) for i in range(0, len(units), step)]


def _split_at_topic_shifts(text: str, spans: list[Span]) -> list[list[Span]]:
    sizes = [text_size(text[start:end]) for start, end in spans]
    if sum(sizes) <= MAX_PARAGRAPH_SIZE or len(spans) == 1:
        return [spans]
    cut = _weakest_gap([text[start:end] for start, end in spans], sizes)
    return _split_at_topic_shifts(text, spans[:cut]) + _split_at_topic_shifts(text, spans[cut:])


def _weakest_gap(sentences: list[str], sizes: list[int]) -> int:
    """The gap (index of the first sentence after it) with the least word overlap across it."""
    counts = [term_counts(sentence) for sentence in sentences]
    total, before = sum(sizes), 0
    candidates = []
    for gap in range(1, len(sentences)):
        before += sizes[gap - 1]
        if min(before, total - before) >= MIN_PARAGRAPH_SIZE:
            left = sum(counts[max(0, gap - COHESION_WINDOW) : gap], Counter())
            right = sum(counts[gap : gap + COHESION_WINDOW], Counter())
            candidates.append((_cosine(left, right), abs(total - 2 * before), gap))
    if not candidates:
        return len(sentences) // 2
    return min(candidates)[2]


def _cosine(left: Counter, right: Counter) -> float:
    dot = sum(count * right[term] for term, count in left.items())
    norm = math.sqrt(sum(c * c for c in left.values()) * sum(c * c for c in right.values()))
    return dot / norm if norm else 0.0
