"""What the retriever hands to the chat service: everything a citation or the admin page shows."""

from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class Document:
    id: int
    collection: str
    name: str
    kind: str  # text, markdown, html, pdf, or turn (a past turn of a session)
    num_bytes: int
    num_paragraphs: int
    created_at: datetime


@dataclass
class Rejected:
    name: str
    reason: str


@dataclass
class UploadResult:
    added: list[Document] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)


@dataclass
class Hit:
    paragraph_id: int
    document_id: int
    document_name: str
    collection: str
    heading: str  # titles of the enclosing sections
    position: int  # paragraph number in the document, from 0
    text: str
    score: float  # what the hits are ranked by (fused in hybrid mode)
    bm25: float
    similarity: float  # the encoder's cosine on the scale common to every encoder; nan in BM25 mode


@dataclass
class Passage:
    """One contiguous piece of a document in the context: a hit, grown or trimmed."""

    document_id: int
    document_name: str
    collection: str
    heading: str
    paragraph_ids: list[int]
    positions: list[int]
    text: str
    num_tokens: int
    reason: str  # hit, neighbours, section, head, tail, key
    score: float  # of the hit it grew from (0 for head and tail)


@dataclass
class Context:
    intent: str
    intent_reason: str  # the rule that decided the intent
    budget_tokens: int  # what this intent may spend, at most the caller's budget
    num_tokens: int  # what the context spends, counted on `text` with the caller's tokenizer
    turns: list[str]  # recent turns kept, oldest first
    passages: list[Passage]
    text: str  # turns and passages as one block for the prompt
