"""A user's knowledge bases and their documents: upload (several files at once), list, delete, and try a
query.  The documents live in the retriever's tables under collection kb:<id>."""

from typing import Annotated

from fastapi import APIRouter, File, UploadFile

from chatsvc.api.deps import CurrentUser, OwnedKnowledgeBase, ServiceDep
from chatsvc.api.schemas import (
    Detail,
    DocumentList,
    Id,
    KnowledgeBaseCreate,
    KnowledgeBaseList,
    KnowledgeBasePublic,
    QueryPreviewPublic,
    QueryRequest,
    UploadResponse,
)

router = APIRouter(prefix="/api/knowledge-bases", tags=["knowledge bases"])
UPLOAD_PATH = r"/api/knowledge-bases/[^/]+/documents"  # has its own request size limit


@router.get("", response_model=KnowledgeBaseList)
async def list_knowledge_bases(user: CurrentUser, service: ServiceDep) -> KnowledgeBaseList:
    found = await service.list_knowledge_bases(user)
    return KnowledgeBaseList(data=found, count=len(found))


@router.post("", response_model=KnowledgeBasePublic, status_code=201)
async def create_knowledge_base(body: KnowledgeBaseCreate, user: CurrentUser, service: ServiceDep):
    return await service.create_knowledge_base(user, body.name)


@router.get("/{knowledge_base_id}", response_model=KnowledgeBasePublic)
def read_knowledge_base(knowledge_base: OwnedKnowledgeBase):
    return knowledge_base


@router.delete("/{knowledge_base_id}", response_model=Detail)
async def delete_knowledge_base(knowledge_base_id: str, user: CurrentUser, service: ServiceDep) -> Detail:
    """With its documents; sessions that used it go on without one."""
    await service.delete_knowledge_base(user, knowledge_base_id)
    return Detail(detail=f"knowledge base {knowledge_base_id} deleted")


@router.get("/{knowledge_base_id}/documents", response_model=DocumentList)
async def list_documents(knowledge_base_id: str, user: CurrentUser, service: ServiceDep) -> DocumentList:
    documents = await service.list_documents(user, knowledge_base_id)
    return DocumentList(data=documents, count=len(documents))


@router.post("/{knowledge_base_id}/documents", response_model=UploadResponse)
async def upload_documents(
    knowledge_base_id: str,
    user: CurrentUser,
    service: ServiceDep,
    files: Annotated[list[UploadFile], File(description=".txt, .md, .html or .pdf files")],
) -> UploadResponse:
    """Each file is indexed or rejected with its reason; one bad file does not stop the others."""
    limit = service.max_file_bytes
    contents = [(file.filename, await file.read(limit + 1)) for file in files]  # over: rejected as such
    result = await service.upload_documents(user, knowledge_base_id, contents)
    return UploadResponse(added=result.added, rejected=result.rejected)


@router.delete("/{knowledge_base_id}/documents/{document_id}", response_model=Detail)
async def delete_document(knowledge_base_id: str, document_id: Id, user: CurrentUser, service: ServiceDep):
    await service.delete_document(user, knowledge_base_id, document_id)
    return Detail(detail=f"document {document_id} deleted")


@router.post("/{knowledge_base_id}/query", response_model=QueryPreviewPublic)
async def try_query(knowledge_base_id: str, body: QueryRequest, user: CurrentUser, service: ServiceDep):
    """What a question would retrieve: the intent and window a turn would get, and the best paragraphs."""
    return await service.try_query(user, knowledge_base_id, body.query, body.k)
