"""The admin page's service methods: every session with its KV, one session's KV in detail, moving a
session's KV (persist, evict, drop), the engine panel, deleting users.  Admins only (Forbidden otherwise).

Session KV comes from the session memory, where the engine has one (engines.session_memory); reading it
copies the session's KV out of the pool, so the list shows the records stored after each turn and action
(sessions' KV records), and only one session's detail is read live.  Mixed into ChatService."""

import asyncio
import contextlib
from dataclasses import asdict

from sqlalchemy.orm import Session

from chatsvc import crud
from chatsvc.errors import Conflict, EngineUnavailable, Forbidden, NotAvailable
from chatsvc.logins import check_password
from chatsvc.models import ChatSession, Role, SessionKvSnapshot, User
from chatsvc.views import EnginePanel, KvState, SessionKvDetail, SessionKvRow
from memory.sessions import kv_files
from memory.sessions.session_memory import SessionInfo, SessionMemory

KV_ACTIONS = ("persist", "evict", "drop")


def require_admin(user: User) -> None:
    if user.role != Role.admin:
        raise Forbidden("this is for admins")


class AdminMethods:
    async def admin_sessions(
        self,
        user: User,
        owner: str | None = None,
        title: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[SessionKvRow], int]:
        """Every user's sessions, newest first, with their KV as last recorded (bytes on disk: now)."""
        require_admin(user)
        rows, total = await self._in_db(crud.admin_session_rows, owner, title, limit, offset)
        return [self._kv_row(*row) for row in rows], total

    async def admin_session_kv(self, user: User, session_id: str) -> SessionKvDetail:
        """A session's conversation, its KV now (positions and importance for the plot) and its evictions."""
        require_admin(user)

        def read(db: Session) -> tuple[ChatSession, str, list]:
            session = crud.find_any_session(db, session_id)
            return session, crud.username(db, session.owner_id), crud.branch(db, session_id)

        session, owner, messages = await self._in_db(read)
        kv = await self._live_kv(session_id)
        events = await self._in_db(crud.eviction_events, session_id)
        return SessionKvDetail(session, owner, messages, kv, list(events))

    async def admin_kv_action(self, user: User, session_id: str, action: str) -> SessionKvDetail:
        """persist: write the KV to disk (it stays in the pool); evict: move it out of the pool onto disk;
        drop: forget it in the pool and on disk (the conversation stays; its next turn recomputes)."""
        require_admin(user)
        if action not in KV_ACTIONS:
            raise ValueError(f"unknown action {action!r}; one of {', '.join(KV_ACTIONS)}")
        await self._in_db(crud.find_any_session, session_id)
        memory = self.engines.session_memory()
        if session_id in self.busy_sessions:
            raise Conflict(f"session {session_id} is generating a reply; its KV is in use")
        if action == "drop":
            await memory.drop(session_id)
        elif not await getattr(memory, action)(session_id):  # persist and evict return bytes written
            raise Conflict(f"session {session_id} has no KV in the pool to {action}")
        return await self.admin_session_kv(user, session_id)

    async def engine_panel(self, user: User) -> EnginePanel:
        require_admin(user)
        counters, note = None, None
        try:
            counters = await asyncio.to_thread(self.engines.session_memory().memory_stats)
        except (EngineUnavailable, NotAvailable) as error:
            note = str(error)
        return self.monitor.panel(self.engines.state, self.engines.stats(), counters, note)

    async def delete_user(self, user: User, user_id: int) -> None:
        """The user with their logins, keys, sessions, messages and knowledge bases, and what the memory holds
        of them.  Their open pages lose access at once: every UI event looks its login up."""
        require_admin(user)
        if user_id == user.id:
            raise Conflict("admins cannot delete themselves")
        session_ids, knowledge_base_ids = await self._in_db(crud.owned_collections, user_id)
        await self._settle_all(session_ids)
        await self._in_db(crud.delete_user, user_id)
        await self._forget_sessions(session_ids)
        for knowledge_base_id in knowledge_base_ids:
            await self.retrieval.forget(f"kb:{knowledge_base_id}")

    async def update_user(
        self,
        user: User,
        user_id: int,
        password: str | None = None,
        disabled: bool | None = None,
        role: Role | None = None,
    ) -> User:
        """A new password or disabling ends the user's logins; disabling also stops their replies and
        refuses their API keys until they are enabled again."""
        require_admin(user)
        if user_id == user.id and (disabled or role == Role.user):
            raise Conflict("admins cannot disable or demote themselves")
        if password is not None:
            check_password(password)
        if disabled:
            session_ids, _ = await self._in_db(crud.owned_collections, user_id)
            await self._settle_all(session_ids)
        return await self._in_db(crud.update_user, user_id, password, disabled, role)

    async def _settle_all(self, session_ids: list[str]) -> None:
        for session_id in session_ids:
            with contextlib.suppress(Conflict):  # one still starting a reply: its KV goes below anyway
                await self._settle(session_id)

    async def _live_kv(self, session_id: str) -> KvState:
        try:
            memory = self.engines.session_memory()
        except (EngineUnavailable, NotAvailable) as error:
            return KvState(available=False, note=str(error))
        if session_id in self.busy_sessions:
            return KvState(available=False, note="generating a reply: its KV is in use")
        info = await self._record_kv(memory, session_id)
        fields = asdict(info)
        del fields["session_id"], fields["evictions"]
        return KvState(available=True, **fields)

    async def _record_kv(
        self, memory: SessionMemory, session_id: str, up_to_message_id: int | None = None
    ) -> SessionInfo:
        """Reads the session's KV from the memory and stores its record and new eviction events."""
        info = await memory.session_info(session_id)
        path = kv_files.session_file(memory.config.sessions_dir, session_id)
        record = dict(
            model_name=memory.model_name,
            path=str(path.relative_to(memory.config.data_dir)),
            location=info.location,
            num_tokens=info.text_tokens,
            cached_tokens=info.cached_tokens,
            evicted_tokens=info.evicted_tokens,
            blocks=info.blocks,
            num_bytes=info.bytes_on_disk,
            warning=info.warning,
        )
        if up_to_message_id is not None:
            record["up_to_message_id"] = up_to_message_id
        policy = "attention" if memory.config.heavy_hitters else "sinks+recent"
        evictions = [asdict(eviction) for eviction in info.evictions]

        def store(db: Session) -> None:
            if db.get(ChatSession, session_id) is None:
                return  # deleted meanwhile
            crud.upsert_kv_record(db, session_id, **record)
            crud.add_eviction_events(db, session_id, policy, evictions)

        async with self.kv_records:
            await self._in_db(store)
        return info

    def _kv_row(
        self, session: ChatSession, owner: str, turns: int, tokens: int | None, kv: SessionKvSnapshot | None
    ) -> SessionKvRow:
        on_disk = None
        if kv is not None:
            path = self.data_dir / kv.path
            on_disk = path.stat().st_size if path.is_file() else 0
        location = kv.location if kv is not None else None
        if location == "none" and on_disk:
            location = "disk"
        return SessionKvRow(
            session_id=session.id,
            title=session.title,
            owner=owner,
            turns=turns,
            tokens=tokens,
            kv_location=location,
            kv_cached_tokens=kv.cached_tokens if kv is not None else None,
            kv_evicted_tokens=kv.evicted_tokens if kv is not None else None,
            kv_bytes_on_disk=on_disk,
            last_activity=session.updated_at,
            generating=session.id in self.busy_sessions,
        )
