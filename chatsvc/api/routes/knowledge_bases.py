"""A user's knowledge bases.  Their documents live in the retriever's tables (collection kb:<id>); the
document routes (upload, list, delete) join this router when the retriever lands."""

from fastapi import APIRouter

from chatsvc import crud
from chatsvc.api.deps import CurrentUser, DbDep, OwnedKnowledgeBase
from chatsvc.api.schemas import Detail, KnowledgeBaseCreate, KnowledgeBaseList, KnowledgeBasePublic

router = APIRouter(prefix="/api/knowledge-bases", tags=["knowledge bases"])


@router.get("", response_model=KnowledgeBaseList)
def list_knowledge_bases(user: CurrentUser, db: DbDep) -> KnowledgeBaseList:
    found = crud.list_knowledge_bases(db, user.id)
    return KnowledgeBaseList(data=found, count=len(found))


@router.post("", response_model=KnowledgeBasePublic, status_code=201)
def create_knowledge_base(body: KnowledgeBaseCreate, user: CurrentUser, db: DbDep):
    return crud.create_knowledge_base(db, user.id, body.name)


@router.get("/{knowledge_base_id}", response_model=KnowledgeBasePublic)
def read_knowledge_base(knowledge_base: OwnedKnowledgeBase):
    return knowledge_base


@router.delete("/{knowledge_base_id}", response_model=Detail)
def delete_knowledge_base(knowledge_base: OwnedKnowledgeBase, db: DbDep) -> Detail:
    # Sessions that used it keep going without one (the foreign key sets theirs to null).  When the
    # retriever lands, its documents under knowledge_base.collection are deleted here too.
    crud.delete_knowledge_base(db, knowledge_base)
    return Detail(detail=f"knowledge base {knowledge_base.id} deleted")
