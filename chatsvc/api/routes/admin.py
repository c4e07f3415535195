"""Admin routes: users, every user's sessions, sessions' KV and the engine panel.  The service refuses
non-admins (403)."""

from typing import Literal

from fastapi import APIRouter, Query

from chatsvc.api.deps import CurrentUser, ServiceDep
from chatsvc.api.schemas import (
    Detail,
    Id,
    Offset,
    PageSize,
    SessionDetail,
    SessionKvDetailPublic,
    SessionKvList,
    SessionList,
    UserCreate,
    UserCreated,
    UserList,
    UserPublic,
    UserUpdate,
)
from chatsvc.views import EnginePanel

router = APIRouter(prefix="/api/admin", tags=["admin"])


@router.get("/users", response_model=UserList)
async def list_users(admin: CurrentUser, service: ServiceDep) -> UserList:
    users = await service.accounts.users(admin)
    return UserList(data=users, count=len(users))


@router.post("/users", response_model=UserCreated, status_code=201)
async def create_user(body: UserCreate, admin: CurrentUser, service: ServiceDep) -> UserCreated:
    """A new user with a first API key (shown once)."""
    user, key = await service.accounts.create_user(admin, body.username, body.role, body.password)
    return UserCreated(**UserPublic.model_validate(user).model_dump(), api_key=key)


@router.delete("/users/{user_id}", response_model=Detail)
async def delete_user(user_id: Id, admin: CurrentUser, service: ServiceDep) -> Detail:
    """Deletes the user with all their sessions, messages and knowledge bases, and their sessions' KV."""
    await service.accounts.delete_user(admin, user_id)
    return Detail(detail=f"user {user_id} deleted")


@router.patch("/users/{user_id}", response_model=UserPublic)
async def update_user(user_id: Id, body: UserUpdate, admin: CurrentUser, service: ServiceDep):
    """A new password, role, or disabled: true/false.  A new password or disabling ends the user's UI
    logins at once; disabling also stops their replies and refuses their API keys until enabled again."""
    return await service.accounts.update_user(admin, user_id, **body.model_dump(exclude_unset=True))


@router.get("/sessions", response_model=SessionList)
async def list_all_sessions(
    admin: CurrentUser,
    service: ServiceDep,
    q: str | None = Query(None, max_length=200),
    archived: bool | None = None,
    limit: PageSize = 100,
    offset: Offset = 0,
) -> SessionList:
    found, total = await service.admin.all_sessions(admin, q, archived, limit, offset)
    return SessionList(data=found, count=total)


@router.get("/sessions/{session_id}", response_model=SessionDetail)
async def inspect_session(session_id: str, admin: CurrentUser, service: ServiceDep) -> SessionDetail:
    return SessionDetail.of(*await service.admin.session(admin, session_id))


@router.get("/kv/sessions", response_model=SessionKvList)
async def list_sessions_kv(
    admin: CurrentUser,
    service: ServiceDep,
    owner: str | None = Query(None, max_length=64, description="part of the owner's name"),
    title: str | None = Query(None, max_length=200, description="part of the title"),
    limit: PageSize = 100,
    offset: Offset = 0,
) -> SessionKvList:
    """Every session with its owner, turns, tokens and KV (as of its last turn or KV action)."""
    rows, total = await service.admin.kv_sessions(admin, owner, title, limit, offset)
    return SessionKvList(data=rows, count=total)


@router.get("/kv/sessions/{session_id}", response_model=SessionKvDetailPublic)
async def session_kv(session_id: str, admin: CurrentUser, service: ServiceDep):
    """The session's conversation, its KV now (positions and importance of the kept tokens) and evictions."""
    return await service.admin.session_kv(admin, session_id)


@router.post("/kv/sessions/{session_id}/{action}", response_model=SessionKvDetailPublic)
async def session_kv_action(
    session_id: str, action: Literal["persist", "evict", "drop"], admin: CurrentUser, service: ServiceDep
):
    """persist: write the KV to disk; evict: move it out of the pool onto disk; drop: forget it."""
    return await service.admin.kv_action(admin, session_id, action)


@router.get("/engine", response_model=EnginePanel)
async def engine_panel(admin: CurrentUser, service: ServiceDep) -> EnginePanel:
    """Requests, KV pool, prefix-cache hit rate, throughput and time to first token over a recent window,
    and the session memory's counters."""
    return await service.admin.engine_panel(admin)
