"""The admin page's service: every session with its KV, one session's KV in detail, moving a session's KV
(persist, evict, drop), every user's sessions, and the engine panel.  Admins only (accounts.require_admin).

Session KV comes from the session memory, where the engine has one (engines.session_memory); reading it
copies the session's KV out of the pool, so the list shows the records stored after each turn and action
(kv_records.py), and only one session's detail is read live."""

import asyncio
from dataclasses import asdict, replace

from sqlalchemy.orm import Session, sessionmaker

from chatsvc import crud
from chatsvc.accounts import require_admin
from chatsvc.db import in_transaction
from chatsvc.engines import EngineLoader
from chatsvc.errors import Conflict, EngineUnavailable, NotAvailable
from chatsvc.kv_records import KvRecords
from chatsvc.models import ChatSession, Message, User
from chatsvc.turn_flow import TurnFlow
from chatsvc.views import EnginePanel, KvState, SessionKvDetail, SessionKvRow

KV_ACTIONS = ("persist", "evict", "drop")


class Admin:
    def __init__(self, db: sessionmaker, engines: EngineLoader, turns: TurnFlow, kv_records: KvRecords):
        self.db = db
        self.engines = engines
        self.turns = turns
        self.kv_records = kv_records

    async def all_sessions(
        self, admin: User, search: str | None, archived: bool | None, limit: int, offset: int
    ) -> tuple[list[ChatSession], int]:
        """Every user's sessions, pinned first, then newest; `search` matches titles and message text."""
        require_admin(admin)
        found, total = await in_transaction(
            self.db, crud.list_sessions, None, archived, search, limit, offset
        )
        return list(found), total

    async def session(self, admin: User, session_id: str) -> tuple[ChatSession, list[Message]]:
        """Any user's session and its active branch."""
        require_admin(admin)

        def read(db: Session) -> tuple[ChatSession, list[Message]]:
            return crud.find_any_session(db, session_id), crud.branch(db, session_id)

        return await in_transaction(self.db, read)

    async def kv_sessions(
        self,
        user: User,
        owner: str | None = None,
        title: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[SessionKvRow], int]:
        """Every user's sessions, newest first, with their KV as last recorded (bytes on disk: now)."""
        require_admin(user)
        rows, total = await in_transaction(self.db, crud.admin_session_rows, owner, title, limit, offset)
        return [self.kv_records.row(*row, self.turns.generating(row[0].id)) for row in rows], total

    async def session_kv(self, user: User, session_id: str) -> SessionKvDetail:
        """A session's conversation, its KV now (positions and importance for the plot) and its evictions."""
        require_admin(user)

        def read(db: Session) -> tuple[ChatSession, str, list]:
            session = crud.find_any_session(db, session_id)
            return session, crud.username(db, session.owner_id), crud.branch(db, session_id)

        session, owner, messages = await in_transaction(self.db, read)
        kv = await self._live_kv(session_id)
        events = await in_transaction(self.db, crud.eviction_events, session_id)
        return SessionKvDetail(session, owner, messages, kv, list(events))

    async def kv_action(self, user: User, session_id: str, action: str) -> SessionKvDetail:
        """persist: write the KV to disk (it stays in the pool); evict: move it out of the pool onto disk;
        drop: forget it in the pool and on disk (the conversation stays; its next turn recomputes)."""
        require_admin(user)
        if action not in KV_ACTIONS:
            raise ValueError(f"unknown action {action!r}; one of {', '.join(KV_ACTIONS)}")
        await in_transaction(self.db, crud.find_any_session, session_id)
        memory = self.engines.session_memory()
        if self.turns.generating(session_id):
            raise Conflict(f"session {session_id} is generating a reply; its KV is in use")
        if action == "drop":
            await memory.drop(session_id)
        elif not await getattr(memory, action)(session_id):  # persist and evict return bytes written
            raise Conflict(f"session {session_id} has no KV in the pool to {action}")
        return await self.session_kv(user, session_id)

    async def engine_panel(self, user: User) -> EnginePanel:
        require_admin(user)
        counters, note = None, None
        try:
            counters = await asyncio.to_thread(self.engines.session_memory().memory_stats)
        except (EngineUnavailable, NotAvailable) as error:
            note = str(error)
        panel = self.turns.monitor.panel(self.engines.state, self.engines.stats(), counters, note)
        served = await asyncio.to_thread(self.turns.sources.retriever.collections_by_encoder)
        models = " · ".join(f"{name}: {count} collections" for name, count in served.items())
        return replace(panel, embedding_models=models or "none yet")

    async def _live_kv(self, session_id: str) -> KvState:
        try:
            memory = self.engines.session_memory()
        except (EngineUnavailable, NotAvailable) as error:
            return KvState(available=False, note=str(error))
        if self.turns.generating(session_id):
            return KvState(available=False, note="generating a reply: its KV is in use")
        info = await self.kv_records.record(memory, session_id)
        fields = asdict(info)
        del fields["session_id"], fields["evictions"]
        return KvState(available=True, **fields)
