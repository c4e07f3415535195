"""Admin routes: users, and every user's sessions.  Non-admins get 403."""

from fastapi import APIRouter, Depends, Query

from chatsvc import crud
from chatsvc.api.deps import AdminUser, DbDep, require_admin
from chatsvc.api.schemas import Detail, SessionDetail, SessionList, UserCreate, UserCreated, UserList
from chatsvc.errors import Conflict

router = APIRouter(prefix="/api/admin", tags=["admin"], dependencies=[Depends(require_admin)])


@router.get("/users", response_model=UserList)
def list_users(db: DbDep) -> UserList:
    users = crud.list_users(db)
    return UserList(data=users, count=len(users))


@router.post("/users", response_model=UserCreated, status_code=201)
def create_user(body: UserCreate, db: DbDep) -> UserCreated:
    """A new user with a first API key (shown once)."""
    user = crud.create_user(db, body.username, body.role, body.password)
    _, key = crud.create_api_key(db, user, "first key")
    return UserCreated(
        id=user.id, username=user.username, role=user.role, created_at=user.created_at, api_key=key
    )


@router.delete("/users/{user_id}", response_model=Detail)
def delete_user(user_id: int, admin: AdminUser, db: DbDep) -> Detail:
    """Deletes the user with all their sessions, messages and knowledge bases."""
    if user_id == admin.id:
        raise Conflict("admins cannot delete themselves")
    crud.delete_user(db, user_id)
    return Detail(detail=f"user {user_id} deleted")


@router.get("/sessions", response_model=SessionList)
def list_all_sessions(
    db: DbDep,
    q: str | None = Query(None, max_length=200),
    archived: bool | None = None,
    limit: int = Query(100, ge=1, le=500),
    offset: int = Query(0, ge=0),
) -> SessionList:
    found, total = crud.list_sessions(db, None, archived, q, limit, offset)
    return SessionList(data=found, count=total)


@router.get("/sessions/{session_id}", response_model=SessionDetail)
def inspect_session(session_id: str, db: DbDep) -> SessionDetail:
    session = crud.find_any_session(db, session_id)
    return SessionDetail.of(session, crud.branch(db, session.id))
