"""Chat sessions: list and search, show, create, change, delete, and the rules for them (titles, sidebar
groups, what may change and how).  Every lookup is scoped to its owner (crud's find_*)."""

from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from chatsvc import crud
from chatsvc.db import in_transaction
from chatsvc.engines import EngineLoader
from chatsvc.errors import Conflict
from chatsvc.models import ChatSession, Message, User
from chatsvc.settings import MIN_SESSION_BUDGET_TOKENS
from chatsvc.sources import TurnSources, session_collection
from chatsvc.turn_flow import TurnFlow

TITLE_MAX = 200  # the column's length
SETTINGS = {"title", "system_prompt", "knowledge_base_id", "temperature", "kv_budget_tokens"}
CHANGEABLE = SETTINGS | {"archived", "pinned"}


def age_group(updated_at: datetime, now: datetime) -> str:
    """The sidebar group of a session last updated at `updated_at` (days counted in UTC)."""
    days = (now.date() - updated_at.date()).days
    if days <= 0:
        return "Today"
    if days == 1:
        return "Yesterday"
    if days < 7:
        return "Previous 7 days"
    if days < 30:
        return "Previous 30 days"
    return "Older"


class ChatSessions:
    def __init__(self, db: sessionmaker, turns: TurnFlow, engines: EngineLoader, sources: TurnSources):
        self.db = db
        self.turns = turns
        self.engines = engines
        self.sources = sources

    async def owned(
        self, user: User, search: str | None = None, archived: bool = False, limit: int = 100, offset: int = 0
    ) -> tuple[list[ChatSession], int]:
        """Pinned first, then newest; `search` matches titles and message text.  Also returns the total."""
        found, total = await in_transaction(
            self.db, crud.list_sessions, user.id, archived, search, limit, offset
        )
        return list(found), total

    async def get(self, user: User, session_id: str) -> tuple[ChatSession, list[Message]]:
        """The session and its active branch, oldest first: what a client shows to resume it."""

        def read(db: Session) -> tuple[ChatSession, list[Message]]:
            return crud.find_session(db, user.id, session_id), crud.branch(db, session_id)

        return await in_transaction(self.db, read)

    async def messages(self, user: User, session_id: str) -> list[Message]:
        """Every message of every branch, oldest first; parent_id links them into a tree."""

        def read(db: Session) -> list[Message]:
            crud.find_session(db, user.id, session_id)
            return list(crud.session_messages(db, session_id))

        return await in_transaction(self.db, read)

    async def message(self, user: User, message_id: int) -> Message:
        return await in_transaction(self.db, crud.find_message, user.id, message_id)

    async def create(self, user: User, **settings) -> ChatSession:
        """settings: title, system_prompt, knowledge_base_id, temperature, kv_budget_tokens."""
        return await in_transaction(self.db, create_session, user, **settings)

    async def update(self, user: User, session_id: str, **changes) -> ChatSession:
        """Any of title, archived, pinned, system_prompt, knowledge_base_id, temperature, kv_budget_tokens."""

        def update(db: Session) -> ChatSession:
            return update_session(db, crud.find_session(db, user.id, session_id), changes)

        return await in_transaction(self.db, update)

    async def rename(self, user: User, session_id: str, title: str) -> ChatSession:
        if not title.strip():
            raise ValueError("the title is empty")
        return await self.update(user, session_id, title=title)

    async def delete(self, user: User, session_id: str) -> None:
        """The session with its messages, its KV (pool and disk) and its indexed past turns."""
        await in_transaction(self.db, crud.find_session, user.id, session_id)
        await self.turns.settle(session_id)

        def delete(db: Session) -> None:
            crud.delete_session(db, crud.find_session(db, user.id, session_id))

        await in_transaction(self.db, delete)
        await self.forget([session_id])

    async def forget(self, session_ids: list[str]) -> None:
        """What the memory holds of deleted sessions: their KV and their indexed turns."""
        for session_id in session_ids:
            await self.engines.forget_session_kv(session_id)
            await self.sources.forget(session_collection(session_id))


def create_session(db: Session, owner: User, **settings) -> ChatSession:
    _check_fields(settings, SETTINGS)
    if settings.get("knowledge_base_id"):
        crud.find_knowledge_base(db, owner.id, settings["knowledge_base_id"])
    return crud.create_session(db, owner.id, **settings)


def update_session(db: Session, session: ChatSession, changes: dict) -> ChatSession:
    """Rename, archive, pin, or change settings.  The system prompt is fixed once a session has messages:
    changing it would rewrite the start of every later prompt and discard the session's cached KV."""
    _check_fields(changes, CHANGEABLE)
    new_prompt = changes.get("system_prompt", session.system_prompt)
    if new_prompt != session.system_prompt and crud.has_messages(db, session.id):
        raise Conflict("the system prompt cannot change once a session has messages; start a new session")
    if changes.get("knowledge_base_id"):
        crud.find_knowledge_base(db, session.owner_id, changes["knowledge_base_id"])
    for name, value in changes.items():
        setattr(session, name, value)
    db.flush()
    return session


def _check_fields(given: dict, known: set[str]) -> None:
    if unknown := set(given) - known:
        raise ValueError(f"unknown session settings {sorted(unknown)}; known: {sorted(known)}")
    if len(given.get("title") or "") > TITLE_MAX:
        raise ValueError(f"a title is at most {TITLE_MAX} characters")
    tokens = given.get("kv_budget_tokens")
    if tokens is not None and tokens < MIN_SESSION_BUDGET_TOKENS:
        raise ValueError(
            f"kv_budget_tokens must be at least {MIN_SESSION_BUDGET_TOKENS}: the session memory always "
            "keeps a session's first and most recent tokens"
        )
