"""Request dependencies: the database session, the caller, and the owner-scoped objects a path names."""

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from chatsvc import crud
from chatsvc.api.schemas import Id
from chatsvc.errors import Forbidden
from chatsvc.models import ChatSession, KnowledgeBase, Message, Role, User
from chatsvc.service import ChatService


def get_service(request: Request) -> ChatService:
    return request.app.state.service


def get_db(service: Annotated[ChatService, Depends(get_service)]) -> Iterator[Session]:
    with service.sessions.begin() as db:  # commits before the response is sent, rolls back on error
        yield db


ServiceDep = Annotated[ChatService, Depends(get_service)]
DbDep = Annotated[Session, Depends(get_db, scope="function")]
bearer = HTTPBearer(auto_error=False, description="an API key: Authorization: Bearer kvc-...")


def current_user(
    service: ServiceDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> User:
    user = None
    if credentials:
        # A transaction of its own: a chat request must not hold a connection while its reply generates.
        with service.sessions.begin() as db:
            user = crud.user_by_api_key(db, credentials.credentials)
    if user is None:
        reason = "invalid API key" if credentials else "missing API key"
        raise HTTPException(
            401, f"{reason}: send Authorization: Bearer <key>", {"WWW-Authenticate": "Bearer"}
        )
    return user


CurrentUser = Annotated[User, Depends(current_user)]


def require_admin(user: CurrentUser) -> User:
    if user.role != Role.admin:
        raise Forbidden("this route is for admins")
    return user


# Ownership lives here and in crud's scoped lookups: another user's id is answered like a missing one.


def owned_session(session_id: str, user: CurrentUser, db: DbDep) -> ChatSession:
    return crud.find_session(db, user.id, session_id)


def owned_message(message_id: Id, user: CurrentUser, db: DbDep) -> Message:
    return crud.find_message(db, user.id, message_id)


def owned_knowledge_base(knowledge_base_id: str, user: CurrentUser, db: DbDep) -> KnowledgeBase:
    return crud.find_knowledge_base(db, user.id, knowledge_base_id)


AdminUser = Annotated[User, Depends(require_admin)]
OwnedSession = Annotated[ChatSession, Depends(owned_session)]
OwnedMessage = Annotated[Message, Depends(owned_message)]
OwnedKnowledgeBase = Annotated[KnowledgeBase, Depends(owned_knowledge_base)]
