"""The caller's own account: who am I, my password, and my API keys."""

from fastapi import APIRouter

from chatsvc import crud
from chatsvc.api.deps import CurrentUser, DbDep, ServiceDep
from chatsvc.api.schemas import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyList,
    Detail,
    Id,
    PasswordChange,
    UserPublic,
)

router = APIRouter(prefix="/api", tags=["account"])


@router.get("/me", response_model=UserPublic)
def read_me(user: CurrentUser):
    return user


@router.put("/me/password", response_model=Detail)
async def change_password(body: PasswordChange, user: CurrentUser, service: ServiceDep) -> Detail:
    """Ends every UI login of the caller (API keys stay valid); a wrong current password is 403."""
    await service.logins.change_password(user, body.current_password, body.new_password)
    return Detail(detail="password changed; log in again")


@router.get("/keys", response_model=ApiKeyList)
def list_keys(user: CurrentUser, db: DbDep) -> ApiKeyList:
    keys = crud.list_api_keys(db, user)
    return ApiKeyList(data=keys, count=len(keys))


@router.post("/keys", response_model=ApiKeyCreated, status_code=201)
def create_key(body: ApiKeyCreate, user: CurrentUser, db: DbDep) -> ApiKeyCreated:
    record, key = crud.create_api_key(db, user, body.name)
    return ApiKeyCreated(id=record.id, name=record.name, created_at=record.created_at, key=key)


@router.delete("/keys/{key_id}", response_model=Detail)
def delete_key(key_id: Id, user: CurrentUser, db: DbDep) -> Detail:
    crud.delete_api_key(db, user, key_id)
    return Detail(detail=f"API key {key_id} deleted")
