"""A user's knowledge bases and their documents: upload (several files at once), list, delete, choose the
embedding model, and try a query.  The documents live in the retriever (chatsvc/sources.py names their
collection)."""

from typing import Annotated

from fastapi import APIRouter, File, UploadFile

from chatsvc.api.deps import CurrentUser, ServiceDep
from chatsvc.api.schemas import (
    Detail,
    DocumentList,
    EmbeddingModelChoice,
    Id,
    KnowledgeBaseCreate,
    KnowledgeBaseList,
    KnowledgeBasePublic,
    QueryRequest,
    UploadResponse,
)
from chatsvc.views import EmbeddingModel, QueryPreview

router = APIRouter(prefix="/api/knowledge-bases", tags=["knowledge bases"])
UPLOAD_PATH = r"/api/knowledge-bases/[^/]+/documents"  # has its own request size limit


@router.get("", response_model=KnowledgeBaseList)
async def list_knowledge_bases(user: CurrentUser, service: ServiceDep) -> KnowledgeBaseList:
    found = await service.knowledge.owned(user)
    return KnowledgeBaseList(data=found, count=len(found))


@router.post("", response_model=KnowledgeBasePublic, status_code=201)
async def create_knowledge_base(body: KnowledgeBaseCreate, user: CurrentUser, service: ServiceDep):
    return await service.knowledge.create(user, body.name)


@router.get("/{knowledge_base_id}", response_model=KnowledgeBasePublic)
async def read_knowledge_base(knowledge_base_id: str, user: CurrentUser, service: ServiceDep):
    return await service.knowledge.get(user, knowledge_base_id)


@router.delete("/{knowledge_base_id}", response_model=Detail)
async def delete_knowledge_base(knowledge_base_id: str, user: CurrentUser, service: ServiceDep) -> Detail:
    """With its documents; sessions that used it go on without one."""
    await service.knowledge.delete(user, knowledge_base_id)
    return Detail(detail=f"knowledge base {knowledge_base_id} deleted")


@router.get("/{knowledge_base_id}/documents", response_model=DocumentList)
async def list_documents(knowledge_base_id: str, user: CurrentUser, service: ServiceDep) -> DocumentList:
    documents = await service.knowledge.documents(user, knowledge_base_id)
    return DocumentList(data=documents, count=len(documents))


@router.post("/{knowledge_base_id}/documents", response_model=UploadResponse)
async def upload_documents(
    knowledge_base_id: str,
    user: CurrentUser,
    service: ServiceDep,
    files: Annotated[list[UploadFile], File(description=".txt, .md, .html or .pdf files")],
) -> UploadResponse:
    """Each file is indexed or rejected with its reason; one bad file does not stop the others."""
    limit = service.knowledge.max_file_bytes
    contents = [(file.filename, await file.read(limit + 1)) for file in files]  # over: rejected as such
    result = await service.knowledge.upload(user, knowledge_base_id, contents)
    return UploadResponse(added=result.added, rejected=result.rejected)


@router.delete("/{knowledge_base_id}/documents/{document_id}", response_model=Detail)
async def delete_document(knowledge_base_id: str, document_id: Id, user: CurrentUser, service: ServiceDep):
    await service.knowledge.delete_document(user, knowledge_base_id, document_id)
    return Detail(detail=f"document {document_id} deleted")


@router.get("/{knowledge_base_id}/embedding-model", response_model=EmbeddingModel)
async def read_embedding_model(knowledge_base_id: str, user: CurrentUser, service: ServiceDep):
    """The encoder of the documents (chosen by the first document's language unless set) and the choices."""
    return await service.knowledge.embedding_model(user, knowledge_base_id)


@router.put("/{knowledge_base_id}/embedding-model", response_model=EmbeddingModel)
async def choose_embedding_model(
    knowledge_base_id: str, body: EmbeddingModelChoice, user: CurrentUser, service: ServiceDep
):
    """Documents embedded by another model are embedded again before this returns (slow for a large one);
    meanwhile searches use the old vectors and uploads are refused."""
    return await service.knowledge.set_embedding_model(user, knowledge_base_id, body.embedding_model)


@router.post("/{knowledge_base_id}/query", response_model=QueryPreview)
async def try_query(knowledge_base_id: str, body: QueryRequest, user: CurrentUser, service: ServiceDep):
    """What a question would retrieve: the intent and window a turn would get, and the best paragraphs."""
    return await service.knowledge.try_query(user, knowledge_base_id, body.query, body.k)
