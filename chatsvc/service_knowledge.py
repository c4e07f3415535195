"""Knowledge bases and their documents: the service methods behind the API and the UI's knowledge page.
Every call looks the knowledge base up by its owner first (crud.find_knowledge_base), and a document only
within it.  Mixed into ChatService, whose retrieval, max_file_bytes and _in_db they use."""

import asyncio
import re
import time
from pathlib import PurePosixPath

from sqlalchemy.orm import Session

from chatsvc import crud
from chatsvc.errors import NotFound
from chatsvc.models import KnowledgeBase, User
from chatsvc.views import QueryPreview
from memory.retrieval import Document, IngestError, Rejected, UploadResult

NAME_MAX = 200  # the column's length
FILE_NAME_MAX = 255
UNSAFE_IN_NAMES = re.compile(r"[\x00-\x1f\x7f]")


class KnowledgeMethods:
    async def list_knowledge_bases(self, user: User) -> list[KnowledgeBase]:
        return list(await self._in_db(crud.list_knowledge_bases, user.id))

    async def create_knowledge_base(self, user: User, name: str) -> KnowledgeBase:
        if not name.strip() or len(name) > NAME_MAX:
            raise ValueError(f"a knowledge base's name is 1 to {NAME_MAX} characters")
        return await self._in_db(crud.create_knowledge_base, user.id, name.strip())

    async def delete_knowledge_base(self, user: User, knowledge_base_id: str) -> None:
        """With its documents; sessions that used it go on without one."""

        def delete(db: Session) -> str:
            knowledge_base = crud.find_knowledge_base(db, user.id, knowledge_base_id)
            crud.delete_knowledge_base(db, knowledge_base)
            return knowledge_base.collection

        await self.retrieval.forget(await self._in_db(delete))

    async def upload_documents(
        self, user: User, knowledge_base_id: str, files: list[tuple[str, bytes]]
    ) -> UploadResult:
        """Indexes each (file name, content); a file that cannot be used is rejected with its reason and
        the others go in.  Slow: the paragraphs are embedded."""
        if not files:
            raise ValueError("no files to upload")
        knowledge_base = await self._knowledge_base(user, knowledge_base_id)
        return await asyncio.to_thread(self._add_files, knowledge_base.collection, files)

    async def list_documents(self, user: User, knowledge_base_id: str) -> list[Document]:
        knowledge_base = await self._knowledge_base(user, knowledge_base_id)
        return await asyncio.to_thread(self.retrieval.retriever.list_documents, knowledge_base.collection)

    async def delete_document(self, user: User, knowledge_base_id: str, document_id: int) -> None:
        documents = await self.list_documents(user, knowledge_base_id)
        if document_id not in {document.id for document in documents}:
            raise NotFound(f"document {document_id} not found")
        await asyncio.to_thread(self.retrieval.retriever.delete_document, document_id)

    async def try_query(self, user: User, knowledge_base_id: str, query: str, k: int = 5) -> QueryPreview:
        """What a turn asking `query` would get from the knowledge base, and its k best paragraphs."""
        collections = [(await self._knowledge_base(user, knowledge_base_id)).collection]
        retriever = self.retrieval.retriever
        started = time.perf_counter()
        context = await asyncio.to_thread(
            retriever.build_context, query, collections, [], self.retrieval.budget_tokens
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

    async def _knowledge_base(self, user: User, knowledge_base_id: str) -> KnowledgeBase:
        return await self._in_db(crud.find_knowledge_base, user.id, knowledge_base_id)

    def _add_files(self, collection: str, files: list[tuple[str, bytes]]) -> UploadResult:
        result = UploadResult()
        taken = {document.name for document in self.retrieval.retriever.list_documents(collection)}
        for raw_name, data in files:
            name = safe_file_name(raw_name)
            try:
                if name in taken:
                    raise IngestError(f"{name}: a document of this name is in the knowledge base already")
                if len(data) > self.max_file_bytes:
                    raise IngestError(f"{name}: larger than the {self.max_file_bytes:,} bytes limit")
                document = self.retrieval.retriever.add_document(
                    collection, name, data, max_bytes=self.max_file_bytes
                )
            except IngestError as error:
                result.rejected.append(Rejected(name, str(error)))
            else:
                result.added.append(document)
                taken.add(name)
        return result


def safe_file_name(name: str | None) -> str:
    """The last part of an uploaded file's name, without control characters; never used as a path."""
    path = PurePosixPath(UNSAFE_IN_NAMES.sub("", (name or "").replace("\\", "/")).strip())
    if len(path.name) > FILE_NAME_MAX:  # cut the stem, keep the suffix that says the file's type
        return path.stem[: FILE_NAME_MAX - len(path.suffix)] + path.suffix
    return path.name or "unnamed"
