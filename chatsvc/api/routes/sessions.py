"""A user's chat sessions: list and search, create, show (resume), rename, archive, pin, delete."""

from fastapi import APIRouter, Query

from chatsvc.api.deps import CurrentUser, ServiceDep
from chatsvc.api.schemas import (
    Detail,
    MessageList,
    MessagePublic,
    Offset,
    PageSize,
    SessionCreate,
    SessionDetail,
    SessionList,
    SessionPublic,
    SessionUpdate,
    StopResult,
)

router = APIRouter(prefix="/api/sessions", tags=["sessions"])


@router.get("", response_model=SessionList)
async def list_sessions(
    user: CurrentUser,
    service: ServiceDep,
    q: str | None = Query(None, max_length=200, description="search titles and message text"),
    archived: bool = False,
    limit: PageSize = 100,
    offset: Offset = 0,
) -> SessionList:
    found, total = await service.chat_sessions.owned(user, q, archived, limit, offset)
    return SessionList(data=found, count=total)


@router.post("", response_model=SessionPublic, status_code=201)
async def create_session(body: SessionCreate, user: CurrentUser, service: ServiceDep):
    return await service.chat_sessions.create(user, **body.model_dump())


@router.get("/{session_id}", response_model=SessionDetail)
async def resume_session(session_id: str, user: CurrentUser, service: ServiceDep) -> SessionDetail:
    """The session and its active branch: what a client shows before continuing it."""
    return SessionDetail.of(*await service.chat_sessions.get(user, session_id))


@router.patch("/{session_id}", response_model=SessionPublic)
async def update_session(session_id: str, body: SessionUpdate, user: CurrentUser, service: ServiceDep):
    return await service.chat_sessions.update(user, session_id, **body.model_dump(exclude_unset=True))


@router.delete("/{session_id}", response_model=Detail)
async def delete_session(session_id: str, user: CurrentUser, service: ServiceDep) -> Detail:
    """With its messages, its KV (in the pool and on disk) and its indexed past turns."""
    await service.chat_sessions.delete(user, session_id)
    return Detail(detail=f"session {session_id} deleted")


@router.post("/{session_id}/stop", response_model=StopResult)
async def stop(session_id: str, user: CurrentUser, service: ServiceDep) -> StopResult:
    """Stop the reply generating in this session; it is stored as aborted with its text so far."""
    return StopResult(stopped=await service.turns.stop(user, session_id))


@router.get("/{session_id}/messages", response_model=MessageList)
async def list_messages(session_id: str, user: CurrentUser, service: ServiceDep) -> MessageList:
    """Every message of every branch, oldest first; parent_id links them into a tree."""
    messages = await service.chat_sessions.messages(user, session_id)
    return MessageList(data=[MessagePublic.model_validate(m) for m in messages], count=len(messages))
