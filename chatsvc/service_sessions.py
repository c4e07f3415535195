"""The session manager's service methods: list and search, show, create, change, delete.
Mixed into ChatService, whose sessions, engines, retrieval, _in_db and _settle they use."""

from sqlalchemy.orm import Session

from chatsvc import crud, sessions
from chatsvc.models import ChatSession, Message, User
from chatsvc.retrieval import session_collection

TITLE_MAX = 200  # the column's length
SETTINGS = {"title", "system_prompt", "knowledge_base_id", "temperature", "kv_budget_tokens"}
CHANGEABLE = SETTINGS | {"archived", "pinned"}


class SessionMethods:
    async def list_sessions(
        self, user: User, search: str | None = None, archived: bool = False, limit: int = 100, offset: int = 0
    ) -> tuple[list[ChatSession], int]:
        """Pinned first, then newest; `search` matches titles and message text.  Also returns the total."""
        found, total = await self._in_db(crud.list_sessions, user.id, archived, search, limit, offset)
        return list(found), total

    async def get_session(self, user: User, session_id: str) -> tuple[ChatSession, list[Message]]:
        """The session and its active branch, oldest first: what a client shows to resume it."""

        def read(db: Session) -> tuple[ChatSession, list[Message]]:
            return crud.find_session(db, user.id, session_id), crud.branch(db, session_id)

        return await self._in_db(read)

    async def session_messages(self, user: User, session_id: str) -> list[Message]:
        """Every message of every branch, oldest first; parent_id links them into a tree."""

        def read(db: Session) -> list[Message]:
            crud.find_session(db, user.id, session_id)
            return list(crud.session_messages(db, session_id))

        return await self._in_db(read)

    async def create_session(self, user: User, **settings) -> ChatSession:
        """settings: title, system_prompt, knowledge_base_id, temperature, kv_budget_tokens."""
        _check_fields(settings, SETTINGS)
        return await self._in_db(sessions.create_session, user, **settings)

    async def update_session(self, user: User, session_id: str, **changes) -> ChatSession:
        """Any of title, archived, pinned, system_prompt, knowledge_base_id, temperature, kv_budget_tokens."""
        _check_fields(changes, CHANGEABLE)

        def update(db: Session) -> ChatSession:
            return sessions.update_session(db, crud.find_session(db, user.id, session_id), changes)

        return await self._in_db(update)

    async def rename_session(self, user: User, session_id: str, title: str) -> ChatSession:
        if not title.strip():
            raise ValueError("the title is empty")
        return await self.update_session(user, session_id, title=title)

    async def delete_session(self, user: User, session_id: str) -> None:
        """The session with its messages, its KV (pool and disk) and its indexed past turns."""
        await self._in_db(crud.find_session, user.id, session_id)
        await self._settle(session_id)

        def delete(db: Session) -> None:
            crud.delete_session(db, crud.find_session(db, user.id, session_id))

        await self._in_db(delete)
        await self._forget_sessions([session_id])

    async def _forget_sessions(self, session_ids: list[str]) -> None:
        """What the memory holds of deleted sessions."""
        for session_id in session_ids:
            await self.engines.forget_session_kv(session_id)
            await self.retrieval.forget(session_collection(session_id))


def _check_fields(given: dict, known: set[str]) -> None:
    if unknown := set(given) - known:
        raise ValueError(f"unknown session settings {sorted(unknown)}; known: {sorted(known)}")
    if len(given.get("title") or "") > TITLE_MAX:
        raise ValueError(f"a title is at most {TITLE_MAX} characters")
