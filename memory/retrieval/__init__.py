"""Hierarchical retrieval over knowledge-base documents and past session turns."""

from memory.retrieval.hybrid import Mode
from memory.retrieval.ingest import IngestError
from memory.retrieval.results import Context, Document, Hit, Passage, Rejected, UploadResult
from memory.retrieval.retriever import Retriever

__all__ = [
    "Context",
    "Document",
    "Hit",
    "IngestError",
    "Mode",
    "Passage",
    "Rejected",
    "Retriever",
    "UploadResult",
]
