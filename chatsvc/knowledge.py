"""Knowledge bases, their documents and their embedding model, behind the API and the UI's knowledge page.
Every call looks the knowledge base up by its owner first (crud.find_knowledge_base), and a document only
within it; the documents live in the retriever under the knowledge base's collection (sources.py names it)."""

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import PurePosixPath

from sqlalchemy.orm import Session, sessionmaker

from chatsvc import crud
from chatsvc.db import in_transaction
from chatsvc.errors import NotFound
from chatsvc.models import KnowledgeBase, User
from chatsvc.sources import TurnSources, knowledge_base_collection
from chatsvc.views import EmbeddingModel, QueryPreview
from memory.retrieval import Document, UploadResult

NAME_MAX = 200  # the column's length
FILE_NAME_MAX = 255
UNSAFE_IN_NAMES = re.compile(r"[\x00-\x1f\x7f]")


class KnowledgeBases:
    def __init__(self, db: sessionmaker, sources: TurnSources, max_file_bytes: int):
        self.db = db
        self.sources = sources
        self.max_file_bytes = max_file_bytes

    async def owned(self, user: User) -> list[KnowledgeBase]:
        return list(await in_transaction(self.db, crud.list_knowledge_bases, user.id))

    async def get(self, user: User, knowledge_base_id: str) -> KnowledgeBase:
        return await in_transaction(self.db, crud.find_knowledge_base, user.id, knowledge_base_id)

    async def create(self, user: User, name: str) -> KnowledgeBase:
        if not name.strip() or len(name) > NAME_MAX:
            raise ValueError(f"a knowledge base's name is 1 to {NAME_MAX} characters")
        return await in_transaction(self.db, crud.create_knowledge_base, user.id, name.strip())

    async def delete(self, user: User, knowledge_base_id: str) -> None:
        """With its documents; sessions that used it go on without one."""

        def delete(db: Session) -> None:
            crud.delete_knowledge_base(db, crud.find_knowledge_base(db, user.id, knowledge_base_id))

        await in_transaction(self.db, delete)
        await self.forget([knowledge_base_id])

    async def forget(self, knowledge_base_ids: list[str]) -> None:
        """The documents of deleted knowledge bases."""
        for knowledge_base_id in knowledge_base_ids:
            await self.sources.forget(knowledge_base_collection(knowledge_base_id))

    async def upload(
        self, user: User, knowledge_base_id: str, files: list[tuple[str, bytes]]
    ) -> UploadResult:
        """Indexes each (file name, content); a file that cannot be used is rejected with its reason and
        the others go in.  Slow: the paragraphs are embedded."""
        if not files:
            raise ValueError("no files to upload")
        collection = await self._collection(user, knowledge_base_id)
        named = [(safe_file_name(name), data) for name, data in files]
        return await asyncio.to_thread(
            self.sources.retriever.add_documents, collection, named, self.max_file_bytes
        )

    async def documents(self, user: User, knowledge_base_id: str) -> list[Document]:
        collection = await self._collection(user, knowledge_base_id)
        return await asyncio.to_thread(self.sources.retriever.list_documents, collection)

    async def delete_document(self, user: User, knowledge_base_id: str, document_id: int) -> None:
        documents = await self.documents(user, knowledge_base_id)
        if document_id not in {document.id for document in documents}:
            raise NotFound(f"document {document_id} not found")
        await asyncio.to_thread(self.sources.retriever.delete_document, document_id)

    async def embedding_model(self, user: User, knowledge_base_id: str) -> EmbeddingModel:
        collection = await self._collection(user, knowledge_base_id)
        name = await asyncio.to_thread(self.sources.retriever.encoder_of, collection)
        return EmbeddingModel(name, list(self.sources.retriever.encoders))

    async def set_embedding_model(
        self,
        user: User,
        knowledge_base_id: str,
        name: str,
        progress: Callable[[int, int], None] | None = None,
    ) -> EmbeddingModel:
        """The encoder of the knowledge base's documents from now on; documents embedded by another are
        embedded again (slow: progress(done, total) after each batch of paragraphs)."""
        collection = await self._collection(user, knowledge_base_id)
        await asyncio.to_thread(self.sources.retriever.set_encoder, collection, name, progress)
        return await self.embedding_model(user, knowledge_base_id)

    async def try_query(self, user: User, knowledge_base_id: str, query: str, k: int = 5) -> QueryPreview:
        """What a turn asking `query` would get from the knowledge base, and its k best paragraphs."""
        collections = [await self._collection(user, knowledge_base_id)]
        retriever = self.sources.retriever
        started = time.perf_counter()
        context = await asyncio.to_thread(
            retriever.build_context, query, collections, [], self.sources.budget_tokens
        )
        latency_ms = round((time.perf_counter() - started) * 1000, 1)
        hits = await asyncio.to_thread(retriever.search, query, collections, k)
        return QueryPreview(
            context.intent,
            context.intent_reason,
            context.budget_tokens,
            context.num_tokens,
            latency_ms,
            context.passages,
            hits,
        )

    async def _collection(self, user: User, knowledge_base_id: str) -> str:
        """The knowledge base's collection in the retriever, once it is found to be the user's."""
        return knowledge_base_collection((await self.get(user, knowledge_base_id)).id)


def safe_file_name(name: str | None) -> str:
    """The last part of an uploaded file's name, without control characters; never used as a path."""
    path = PurePosixPath(UNSAFE_IN_NAMES.sub("", (name or "").replace("\\", "/")).strip())
    if len(path.name) > FILE_NAME_MAX:  # cut the stem, keep the suffix that says the file's type
        return path.stem[: FILE_NAME_MAX - len(path.suffix)] + path.suffix
    return path.name or "unnamed"
