"""Where each session's KV is and what it holds, stored after every turn and KV action (one row a session,
and the evictions since), so the admin list reads these records instead of copying every session's KV out
of the pool; only one session's detail is read live."""

import asyncio
from dataclasses import asdict
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from chatsvc import crud
from chatsvc.db import in_transaction
from chatsvc.models import ChatSession, SessionKvSnapshot
from chatsvc.views import SessionKvRow
from memory.session_memory.session_memory import SessionInfo, SessionMemory, located


class KvRecords:
    def __init__(self, db: sessionmaker, data_dir: Path):
        self.db = db
        self.data_dir = data_dir
        self.writing = asyncio.Lock()  # one writer of records at a time

    async def record(
        self, memory: SessionMemory, session_id: str, up_to_message_id: int | None = None
    ) -> SessionInfo:
        """Reads the session's KV from the memory and stores its record and new eviction events."""
        info = await memory.session_info(session_id)
        record = dict(
            model_name=memory.model_name,
            path=str(memory.config.session_file(session_id).relative_to(self.data_dir)),
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

        async with self.writing:
            await in_transaction(self.db, store)
        return info

    def row(
        self,
        session: ChatSession,
        owner: str,
        turns: int,
        tokens: int | None,
        kv: SessionKvSnapshot | None,
        generating: bool,
    ) -> SessionKvRow:
        """A session with its KV as last recorded, and the bytes its file holds on disk now."""
        on_disk = None
        if kv is not None:
            path = self.data_dir / kv.path
            on_disk = path.stat().st_size if path.is_file() else 0
        return SessionKvRow(
            session_id=session.id,
            title=session.title,
            owner=owner,
            turns=turns,
            tokens=tokens,
            kv_location=located(kv.location, on_disk) if kv is not None else None,
            kv_cached_tokens=kv.cached_tokens if kv is not None else None,
            kv_evicted_tokens=kv.evicted_tokens if kv is not None else None,
            kv_bytes_on_disk=on_disk,
            last_activity=session.updated_at,
            generating=generating,
        )
