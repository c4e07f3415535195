"""The chat service's tables.  Only Alembic (migrations/) creates them; the API's schemas live apart."""

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import ClassVar

from sqlalchemy import (
    JSON,
    DateTime,
    Enum,
    ForeignKey,
    Index,
    MetaData,
    String,
    Text,
    TypeDecorator,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from memory.retrieval.tables import NAMING_CONVENTION


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes on every database (SQLite drops the zone, so it is put back on read)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Role(StrEnum):
    admin = "admin"
    user = "user"


class MessageStatus(StrEnum):
    pending = "pending"
    streaming = "streaming"
    done = "done"
    error = "error"
    aborted = "aborted"
    interrupted = "interrupted"


UNFINISHED = (MessageStatus.pending, MessageStatus.streaming)


def _enum(cls: type[StrEnum]) -> Enum:
    return Enum(cls, native_enum=False, length=16, values_callable=lambda members: [m.value for m in members])


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict] = {
        datetime: UTCDateTime(),
        Role: _enum(Role),
        MessageStatus: _enum(MessageStatus),
    }


class User(Base):
    __tablename__ = "users"
    # Ids are never reused (SQLite would otherwise hand a deleted user's id to the next user).
    __table_args__: ClassVar[dict] = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str | None] = mapped_column(String(256))
    role: Mapped[Role] = mapped_column(default=Role.user)
    disabled: Mapped[bool] = mapped_column(default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Login(Base):
    """A browser's login to the UI: its cookie holds the token, the table only the token's hash.  Logging
    out, a password change, disabling or deleting the user end it; it expires by itself at expires_at."""

    __tablename__ = "logins"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)  # what the UI's events see
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the cookie's token
    address: Mapped[str | None] = mapped_column(String(64))  # the client's, at login
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the key
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class KnowledgeBase(Base):
    """A named set of documents; the documents live in the retriever's tables (chatsvc/sources.py)."""

    __tablename__ = "knowledge_bases"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ChatSession(Base):
    __tablename__ = "chat_sessions"
    __table_args__ = (Index("ix_chat_sessions_owner_updated", "owner_id", "updated_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    title: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    archived: Mapped[bool] = mapped_column(default=False)
    pinned: Mapped[bool] = mapped_column(default=False)
    system_prompt: Mapped[str | None] = mapped_column(Text)
    knowledge_base_id: Mapped[str | None] = mapped_column(
        ForeignKey("knowledge_bases.id", ondelete="SET NULL"), index=True
    )
    temperature: Mapped[float | None]
    kv_budget_tokens: Mapped[int | None]  # the session memory's limit on this session's kept KV


class Message(Base):
    __tablename__ = "messages"

    id: Mapped[int] = mapped_column(primary_key=True)  # increasing: the newest message is a branch's tip
    session_id: Mapped[str] = mapped_column(ForeignKey("chat_sessions.id", ondelete="CASCADE"), index=True)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text, default="")
    # Sources retrieved for a user message, numbered from 1; stored so later prompts repeat them verbatim.
    context: Mapped[list | None] = mapped_column(JSON)
    retrieval: Mapped[dict | None] = mapped_column(JSON)  # how they were chosen: intent, window, latency
    status: Mapped[MessageStatus] = mapped_column(default=MessageStatus.done)
    error: Mapped[str | None] = mapped_column(Text)
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    replica_id: Mapped[str | None] = mapped_column(String(64))  # the replica generating it, while it does
    prompt_tokens: Mapped[int | None]
    cached_tokens: Mapped[int | None]
    completion_tokens: Mapped[int | None]
    ttft_seconds: Mapped[float | None]
    tokens_per_second: Mapped[float | None]
    draft_tokens: Mapped[int | None]  # speculative decoding: tokens drafted for this reply
    accepted_tokens: Mapped[int | None]  # of those, accepted
    citations: Mapped[list | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class SessionKvSnapshot(Base):
    """Where a session's KV was and what it held, as of its last turn or KV action (one row per session):
    the admin list reads these instead of copying every session's KV out of the pool."""

    __tablename__ = "session_kv_snapshots"

    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[str] = mapped_column(
        ForeignKey("chat_sessions.id", ondelete="CASCADE"), index=True, unique=True
    )
    up_to_message_id: Mapped[int | None] = mapped_column(ForeignKey("messages.id", ondelete="SET NULL"))
    model_name: Mapped[str] = mapped_column(String(200))
    path: Mapped[str] = mapped_column(String(500))  # the KV file, relative to the data dir
    location: Mapped[str] = mapped_column(String(8), server_default="none")  # pool, disk or none
    num_tokens: Mapped[int]  # tokens of the conversation the KV covers
    cached_tokens: Mapped[int] = mapped_column(server_default="0")  # KV slots held
    evicted_tokens: Mapped[int] = mapped_column(server_default="0")  # slots dropped by eviction so far
    blocks: Mapped[int] = mapped_column(server_default="0")
    num_bytes: Mapped[int]  # of the KV file on disk
    warning: Mapped[str | None] = mapped_column(Text)  # why a saved KV could not be used
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime | None] = mapped_column(default=utcnow, onupdate=utcnow)


class EvictionEvent(Base):
    """The session memory dropped part of a session's KV to stay within its budget.  created_at is when
    it happened; details hold tokens_after, kept_spans ([start, end) text positions) and the memory's time."""

    __tablename__ = "eviction_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("chat_sessions.id", ondelete="CASCADE"), index=True)
    policy: Mapped[str] = mapped_column(String(32))
    num_tokens_before: Mapped[int]
    num_tokens_evicted: Mapped[int]
    details: Mapped[dict | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
