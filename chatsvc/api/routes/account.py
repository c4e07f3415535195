"""The caller's own account: who am I, and my API keys."""

from fastapi import APIRouter

from chatsvc import crud
from chatsvc.api.deps import CurrentUser, DbDep
from chatsvc.api.schemas import ApiKeyCreate, ApiKeyCreated, ApiKeyList, Detail, UserPublic

router = APIRouter(prefix="/api", tags=["account"])


@router.get("/me", response_model=UserPublic)
def read_me(user: CurrentUser):
    return user


@router.get("/keys", response_model=ApiKeyList)
def list_keys(user: CurrentUser, db: DbDep) -> ApiKeyList:
    keys = crud.list_api_keys(db, user)
    return ApiKeyList(data=keys, count=len(keys))


@router.post("/keys", response_model=ApiKeyCreated, status_code=201)
def create_key(body: ApiKeyCreate, user: CurrentUser, db: DbDep) -> ApiKeyCreated:
    record, key = crud.create_api_key(db, user, body.name)
    return ApiKeyCreated(id=record.id, name=record.name, created_at=record.created_at, key=key)


@router.delete("/keys/{key_id}", response_model=Detail)
def delete_key(key_id: int, user: CurrentUser, db: DbDep) -> Detail:
    crud.delete_api_key(db, user, key_id)
    return Detail(detail=f"API key {key_id} deleted")
