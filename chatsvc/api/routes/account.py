"""The caller's own account: who am I, my password, and my API keys."""

from fastapi import APIRouter

from chatsvc.api.deps import CurrentUser, ServiceDep
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
    await service.accounts.change_password(user, body.current_password, body.new_password)
    return Detail(detail="password changed; log in again")


@router.get("/keys", response_model=ApiKeyList)
async def list_keys(user: CurrentUser, service: ServiceDep) -> ApiKeyList:
    keys = await service.accounts.api_keys(user)
    return ApiKeyList(data=keys, count=len(keys))


@router.post("/keys", response_model=ApiKeyCreated, status_code=201)
async def create_key(body: ApiKeyCreate, user: CurrentUser, service: ServiceDep) -> ApiKeyCreated:
    record, key = await service.accounts.create_api_key(user, body.name)
    return ApiKeyCreated(id=record.id, name=record.name, created_at=record.created_at, key=key)


@router.delete("/keys/{key_id}", response_model=Detail)
async def delete_key(key_id: Id, user: CurrentUser, service: ServiceDep) -> Detail:
    await service.accounts.delete_api_key(user, key_id)
    return Detail(detail=f"API key {key_id} deleted")
