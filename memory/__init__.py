"""Session memory and the context retriever."""

from memory.retrieval import Context, Document, Hit, IngestError, Mode, Passage, Retriever, UploadResult

__all__ = ["Context", "Document", "Hit", "IngestError", "Mode", "Passage", "Retriever", "UploadResult"]
