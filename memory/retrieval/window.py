"""Dynamic windows: the context grows where the evidence is dense and stops where it thins out.

Hits are kept while their similarity to the query stays near the best hit's (a confident answer costs one
paragraph, a spread-out one several).  A section whose children are mostly hits is taken whole (as
LlamaIndex's auto-merging retriever does); another hit grows into a neighbour that is itself similar to the
query, or that a too-short paragraph needs to make sense; hits one paragraph apart are joined with the
gap.  Passages then fill the token budget best-first, trimmed to whole sentences where one does not fit.
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from memory.retrieval.results import Passage
from memory.retrieval.store import ParagraphRow

KEEP_MARGIN = 0.1  # similarity (Encoder.similarity) below the best hit's at which hits stop being kept
SHORT_PARAGRAPH_TOKENS = 24  # a paragraph this short is read with the next one (a heading line, "Yes.")


@dataclass
class Candidate:
    row: ParagraphRow
    rank: int  # from 1
    score: float
    similarity: float


class DocumentView(Protocol):
    """What growing a window needs to know about the documents of the hits."""

    def rows_at(self, document_id: int, positions: Iterable[int]) -> list[ParagraphRow]: ...

    def section_size(self, section_id: int) -> int: ...

    def section_rows(self, section_id: int) -> list[ParagraphRow]: ...

    def similarity(self, rows: Sequence[ParagraphRow]) -> list[float]: ...


def select(candidates: Sequence[Candidate], max_hits: int) -> list[Candidate]:
    if not candidates:
        return []
    floor = candidates[0].similarity - KEEP_MARGIN
    return [candidate for candidate in candidates[:max_hits] if candidate.similarity >= floor]


@dataclass
class Span:
    """Consecutive paragraphs of one document, led by the hit they grew from."""

    rows: list[ParagraphRow]
    hit: Candidate
    reason: str  # hit, neighbours, section, head, tail, key


def grow(hits: Sequence[Candidate], view: DocumentView, count_tokens: Callable[[str], int]) -> list[Span]:
    """Spans around the hits, best first."""
    if not hits:
        return []
    floor = hits[0].similarity - KEEP_MARGIN
    ranges: dict[int, list[tuple[int, int, Candidate, str]]] = {}  # document -> (first, last, hit, why)
    merged_sections = _sections_mostly_hit(hits, view)
    for hit in hits:
        row = hit.row
        if row.section_id in merged_sections:
            first, last, reason = *merged_sections[row.section_id], "section"
        else:
            first, last, reason = _grow_hit(row, view, floor, count_tokens)
        ranges.setdefault(row.document_id, []).append((first, last, hit, reason))
    spans = []
    for document_id, document_ranges in ranges.items():
        for first, last, hit, reason in _join_close(document_ranges):
            spans.append(Span(view.rows_at(document_id, range(first, last + 1)), hit, reason))
    return sorted(spans, key=lambda span: span.hit.rank)


def _sections_mostly_hit(hits: Sequence[Candidate], view: DocumentView) -> dict[int, tuple[int, int]]:
    by_section: dict[int, int] = {}
    for hit in hits:
        by_section[hit.row.section_id] = by_section.get(hit.row.section_id, 0) + 1
    merged = {}
    for section_id, num_hits in by_section.items():
        if num_hits >= 2 and num_hits > view.section_size(section_id) / 2:
            rows = view.section_rows(section_id)
            merged[section_id] = (rows[0].position, rows[-1].position)
    return merged


def _grow_hit(
    row: ParagraphRow, view: DocumentView, floor: float, count_tokens: Callable[[str], int]
) -> tuple[int, int, str]:
    neighbours = [
        other
        for other in view.rows_at(row.document_id, (row.position - 1, row.position + 1))
        if other.section_id == row.section_id
    ]
    short = count_tokens(row.text) < SHORT_PARAGRAPH_TOKENS
    taken = [
        other.position
        for other, similarity in zip(neighbours, view.similarity(neighbours), strict=True)
        if similarity >= floor or (short and other.position == row.position + 1)
    ]
    if not taken:
        return row.position, row.position, "hit"
    return min(row.position, *taken), max(row.position, *taken), "neighbours"


def _join_close(ranges: list[tuple[int, int, Candidate, str]]) -> list[tuple[int, int, Candidate, str]]:
    """Ranges of one document that overlap or leave a one-paragraph gap become one, led by the best hit."""
    joined: list[tuple[int, int, Candidate, str]] = []
    for first, last, hit, reason in sorted(ranges, key=lambda item: item[0]):
        if joined and first <= joined[-1][1] + 2:
            before_first, before_last, before_hit, before_reason = joined[-1]
            best = before_hit if before_hit.rank <= hit.rank else hit
            why = reason if reason == before_reason else "neighbours"
            joined[-1] = (before_first, max(before_last, last), best, why)
        else:
            joined.append((first, last, hit, reason))
    return joined


@dataclass
class Filled:
    turns: list[str]
    passages: list[Passage]
    text: str
    num_tokens: int


def fill(
    recent_turns: Sequence[str],
    turn_budget: int,
    spans: Sequence[Span],
    budget: int,
    count_tokens: Callable[[str], int],
    in_document_order: bool = False,
) -> Filled:
    """Newest turns within turn_budget, then spans best-first while the whole stays within budget."""
    turns: list[str] = []
    for turn in reversed(recent_turns):
        if count_tokens(render([turn, *turns], [])) > min(turn_budget, budget):
            break
        turns.insert(0, turn)
    passages: list[Passage] = []
    for span in spans:
        passage = _fitting_passage(turns, passages, span, budget, count_tokens)
        if passage is not None:
            passages.append(passage)
    if in_document_order:
        passages.sort(key=lambda passage: (passage.document_id, passage.positions[0]))
    text = render(turns, passages)
    num_tokens = count_tokens(text)
    assert num_tokens <= budget, "fill() checks every addition against the budget"
    return Filled(turns, passages, text, num_tokens)


def _fitting_passage(turns, passages, span: Span, budget: int, count_tokens) -> Passage | None:
    """The whole span, else its longest part from the hit on that fits, cut at a sentence end."""
    for passage in [_passage(span.rows, span.hit, span.reason), *_from_hit_on(span)]:
        if count_tokens(render(turns, [*passages, passage])) <= budget:
            passage.num_tokens = count_tokens(passage.text)
            return passage
    return None


def _from_hit_on(span: Span) -> list[Passage]:
    """Shorter and shorter texts from the start of the hit paragraph, each ending at a sentence end."""
    rows = [row for row in span.rows if row.position >= span.hit.row.position]
    texts, done = [], ""
    for row in rows:
        for end in row.sentence_ends:
            texts.append(
                (done + row.text[:end].strip(), rows[: rows.index(row) + 1], end == row.sentence_ends[-1])
            )
        done += row.text + "\n\n"
    return [
        _passage(used, span.hit, "hit" if whole and len(used) == 1 else "trimmed", text)
        for text, used, whole in reversed(texts)
    ]


def _passage(rows: Sequence[ParagraphRow], hit: Candidate, reason: str, text: str | None = None) -> Passage:
    return Passage(
        document_id=hit.row.document_id,
        document_name=hit.row.document_name,
        collection=hit.row.collection,
        heading=hit.row.heading,
        paragraph_ids=[row.id for row in rows],
        positions=[row.position for row in rows],
        text=text if text is not None else "\n\n".join(row.text for row in rows),
        num_tokens=0,
        reason=reason,
        score=hit.score,
    )


def render(turns: Sequence[str], passages: Sequence[Passage]) -> str:
    parts = []
    if turns:
        parts.append("Earlier in this conversation:\n" + "\n".join(turns))
    for number, passage in enumerate(passages, start=1):
        source = passage.document_name + (f" > {passage.heading}" if passage.heading else "")
        parts.append(f"[{number}] {source}\n{passage.text}")
    return "\n\n".join(parts)


def key_paragraphs(ids: np.ndarray, vectors: np.ndarray, count: int, diversity: float = 0.5) -> list[int]:
    """Paragraphs closest to the centroid, each also far from those already picked (maximal marginal
    relevance), so a summary covers the main topics rather than one topic many times."""
    if not len(ids):
        return []
    centrality = vectors @ vectors.mean(axis=0)
    picked: list[int] = []
    redundancy = np.full(len(ids), -np.inf)
    for _ in range(min(count, len(ids))):
        value = (1 - diversity) * centrality - diversity * np.maximum(redundancy, 0)
        value[picked] = -np.inf
        best = int(np.argmax(value))
        picked.append(best)
        redundancy = np.maximum(redundancy, vectors @ vectors[best])
    return [int(ids[position]) for position in picked]
