"""A user's chat sessions: list and search, create, show (resume), rename, archive, pin, delete."""

from fastapi import APIRouter, Query

from chatsvc import crud, sessions
from chatsvc.api.deps import CurrentUser, DbDep, OwnedSession, ServiceDep
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
def list_sessions(
    user: CurrentUser,
    db: DbDep,
    q: str | None = Query(None, max_length=200, description="search titles and message text"),
    archived: bool = False,
    limit: PageSize = 100,
    offset: Offset = 0,
) -> SessionList:
    found, total = crud.list_sessions(db, user.id, archived, q, limit, offset)
    return SessionList(data=found, count=total)


@router.post("", response_model=SessionPublic, status_code=201)
def create_session(body: SessionCreate, user: CurrentUser, db: DbDep):
    return sessions.create_session(db, user, **body.model_dump())


@router.get("/{session_id}", response_model=SessionDetail)
def resume_session(session: OwnedSession, db: DbDep) -> SessionDetail:
    """The session and its active branch: what a client shows before continuing it."""
    return SessionDetail.of(session, crud.branch(db, session.id))


@router.patch("/{session_id}", response_model=SessionPublic)
def update_session(body: SessionUpdate, session: OwnedSession, db: DbDep):
    return sessions.update_session(db, session, body.model_dump(exclude_unset=True))


@router.delete("/{session_id}", response_model=Detail)
async def delete_session(session_id: str, user: CurrentUser, service: ServiceDep) -> Detail:
    """With its messages, its KV (in the pool and on disk) and its indexed past turns."""
    await service.delete_session(user, session_id)
    return Detail(detail=f"session {session_id} deleted")


@router.post("/{session_id}/stop", response_model=StopResult)
async def stop(session_id: str, user: CurrentUser, service: ServiceDep) -> StopResult:
    """Stop the reply generating in this session; it is stored as aborted with its text so far."""
    return StopResult(stopped=await service.stop(user, session_id))


@router.get("/{session_id}/messages", response_model=MessageList)
def list_messages(session: OwnedSession, db: DbDep) -> MessageList:
    """Every message of every branch, oldest first; parent_id links them into a tree."""
    messages = crud.session_messages(db, session.id)
    return MessageList(data=[MessagePublic.model_validate(m) for m in messages], count=len(messages))
