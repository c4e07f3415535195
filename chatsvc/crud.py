"""Every database query of the chat service.  Routes and the turn flow call these, never SQL directly."""

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import delete, exists, func, or_, select, update
from sqlalchemy.orm import Session

from chatsvc.errors import Conflict, NotFound
from chatsvc.models import (
    UNFINISHED,
    ApiKey,
    ChatSession,
    EvictionEvent,
    KnowledgeBase,
    Login,
    Message,
    MessageStatus,
    Role,
    SessionKvSnapshot,
    User,
    utcnow,
)
from chatsvc.security import decoy_password_hash, hash_password, hash_token, new_api_key, verify_password

FIRST_ADMIN = "admin"
SETTINGS_KEY_NAME = "from settings"

# --- Scoped lookups: every lookup of a session, message or knowledge base by id goes through these. ---


def find_session(db: Session, owner_id: int, session_id: str) -> ChatSession:
    found = db.scalar(
        select(ChatSession).where(ChatSession.id == session_id, ChatSession.owner_id == owner_id)
    )
    if found is None:
        raise NotFound(f"session {session_id} not found")
    return found


def find_message(db: Session, owner_id: int, message_id: int) -> Message:
    found = db.scalar(
        select(Message)
        .join(ChatSession, Message.session_id == ChatSession.id)
        .where(Message.id == message_id, ChatSession.owner_id == owner_id)
    )
    if found is None:
        raise NotFound(f"message {message_id} not found")
    return found


def find_knowledge_base(db: Session, owner_id: int, knowledge_base_id: str) -> KnowledgeBase:
    found = db.scalar(
        select(KnowledgeBase).where(KnowledgeBase.id == knowledge_base_id, KnowledgeBase.owner_id == owner_id)
    )
    if found is None:
        raise NotFound(f"knowledge base {knowledge_base_id} not found")
    return found


def find_any_session(db: Session, session_id: str) -> ChatSession:
    """Unscoped: for admin routes only."""
    found = db.get(ChatSession, session_id)
    if found is None:
        raise NotFound(f"session {session_id} not found")
    return found


# --- Users and API keys ---


def user_by_api_key(db: Session, key: str) -> User | None:
    return db.scalar(
        select(User).join(ApiKey).where(ApiKey.key_hash == hash_token(key), User.disabled.is_(False))
    )


def user_by_password(db: Session, username: str, password: str) -> User | None:
    """Hashes the password once whether or not the user exists, so the time taken tells no one which
    names exist."""
    user = db.scalar(select(User).where(User.username == username))
    stored = user.password_hash if user is not None else None
    matches = verify_password(password, stored or decoy_password_hash())
    return user if matches and stored and not user.disabled else None


def username(db: Session, user_id: int) -> str:
    return db.scalar(select(User.username).where(User.id == user_id)) or ""


def create_user(db: Session, username: str, role: Role = Role.user, password: str | None = None) -> User:
    if db.scalar(select(exists().where(User.username == username))):
        raise Conflict(f"user {username!r} exists already")
    user = User(username=username, role=role, password_hash=hash_password(password) if password else None)
    db.add(user)
    db.flush()
    return user


def list_users(db: Session) -> Sequence[User]:
    return db.scalars(select(User).order_by(User.id)).all()


def find_user(db: Session, user_id: int) -> User:
    user = db.get(User, user_id)
    if user is None:
        raise NotFound(f"user {user_id} not found")
    return user


def delete_user(db: Session, user_id: int) -> None:
    db.delete(find_user(db, user_id))  # its logins and API keys go with it (ON DELETE CASCADE)


def update_user(
    db: Session, user_id: int, password: str | None, disabled: bool | None, role: Role | None
) -> User:
    """Changes what is given; a new password or disabling ends the user's logins."""
    user = find_user(db, user_id)
    if password is not None:
        user.password_hash = hash_password(password)
    if disabled is not None:
        user.disabled = disabled
    if role is not None:
        user.role = role
    if password is not None or disabled:
        end_logins(db, user_id)
    return user


# --- UI logins: the cookie holds a random token, the table its hash ---


def create_login(db: Session, user: User, token: str, address: str | None, expires_at: datetime) -> Login:
    login = Login(user_id=user.id, token_hash=hash_token(token), address=address, expires_at=expires_at)
    db.add(login)
    db.flush()
    return login


def login_by_token(db: Session, token: str) -> Login | None:
    """The unexpired login holding this token, of a user who may still log in."""
    return db.scalar(
        select(Login)
        .join(User)
        .where(Login.token_hash == hash_token(token), Login.expires_at > utcnow(), User.disabled.is_(False))
    )


def user_by_login(db: Session, login_id: str) -> User | None:
    return db.scalar(
        select(User)
        .join(Login)
        .where(Login.id == login_id, Login.expires_at > utcnow(), User.disabled.is_(False))
    )


def end_login(db: Session, token: str) -> None:
    db.execute(delete(Login).where(Login.token_hash == hash_token(token)))


def end_logins(db: Session, user_id: int) -> None:
    db.execute(delete(Login).where(Login.user_id == user_id))


def delete_expired_logins(db: Session) -> None:
    db.execute(delete(Login).where(Login.expires_at <= utcnow()))


def create_api_key(db: Session, user: User, name: str) -> tuple[ApiKey, str]:
    """The key itself is returned once and never stored; only its hash is."""
    key = new_api_key()
    record = ApiKey(user_id=user.id, name=name, key_hash=hash_token(key))
    db.add(record)
    db.flush()
    return record, key


def owned_collections(db: Session, user_id: int) -> tuple[list[str], list[str]]:
    """The user's session ids and knowledge-base ids: what deleting the user leaves in the memory."""
    sessions = db.scalars(select(ChatSession.id).where(ChatSession.owner_id == user_id)).all()
    bases = db.scalars(select(KnowledgeBase.id).where(KnowledgeBase.owner_id == user_id)).all()
    return list(sessions), list(bases)


def list_api_keys(db: Session, user: User) -> Sequence[ApiKey]:
    return db.scalars(select(ApiKey).where(ApiKey.user_id == user.id).order_by(ApiKey.id)).all()


def delete_api_key(db: Session, user: User, key_id: int) -> None:
    if db.execute(delete(ApiKey).where(ApiKey.id == key_id, ApiKey.user_id == user.id)).rowcount == 0:
        raise NotFound(f"API key {key_id} not found")


def ensure_first_admin(
    db: Session, api_key: str | None, password: str | None
) -> tuple[User, str | None, str | None]:
    """Create the admin 'admin' on first start; the settings' key and password always apply.

    Returns the admin, and the API key and password generated for a new admin where the settings gave
    none (so a first `make run` can log in)."""
    admin = db.scalar(select(User).where(User.username == FIRST_ADMIN))  # None on the first start
    generated_key = generated_password = None
    if admin is None:
        admin = create_user(db, FIRST_ADMIN, Role.admin)
        if api_key is None:
            api_key = generated_key = new_api_key()
        if not password:
            password = generated_password = secrets.token_urlsafe(12)
    if api_key is not None:
        _set_settings_key(db, admin, api_key)
    if password:
        admin.password_hash = hash_password(password)
    return admin, generated_key, generated_password


def _set_settings_key(db: Session, admin: User, api_key: str) -> None:
    record = db.scalar(select(ApiKey).where(ApiKey.user_id == admin.id, ApiKey.name == SETTINGS_KEY_NAME))
    if record is None:
        db.add(ApiKey(user_id=admin.id, name=SETTINGS_KEY_NAME, key_hash=hash_token(api_key)))
    else:
        record.key_hash = hash_token(api_key)


# --- Knowledge bases ---


def create_knowledge_base(db: Session, owner_id: int, name: str) -> KnowledgeBase:
    knowledge_base = KnowledgeBase(owner_id=owner_id, name=name)
    db.add(knowledge_base)
    db.flush()
    return knowledge_base


def list_knowledge_bases(db: Session, owner_id: int) -> Sequence[KnowledgeBase]:
    query = select(KnowledgeBase).where(KnowledgeBase.owner_id == owner_id).order_by(KnowledgeBase.created_at)
    return db.scalars(query).all()


def delete_knowledge_base(db: Session, knowledge_base: KnowledgeBase) -> None:
    db.delete(knowledge_base)


# --- Sessions ---


def create_session(db: Session, owner_id: int, **settings) -> ChatSession:
    session = ChatSession(owner_id=owner_id, **settings)
    db.add(session)
    db.flush()
    return session


def list_sessions(
    db: Session,
    owner_id: int | None,
    archived: bool | None = False,
    search: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[Sequence[ChatSession], int]:
    """Pinned first, then most recently updated; `search` matches titles and message text.

    owner_id None lists every user's sessions (admin routes only)."""
    query = select(ChatSession)
    if owner_id is not None:
        query = query.where(ChatSession.owner_id == owner_id)
    if archived is not None:
        query = query.where(ChatSession.archived == archived)
    if search:
        pattern = _literal_pattern(search)
        in_messages = exists().where(
            Message.session_id == ChatSession.id, Message.content.ilike(pattern, "\\")
        )
        query = query.where(or_(ChatSession.title.ilike(pattern, "\\"), in_messages))
    total = db.scalar(select(func.count()).select_from(query.subquery()))
    page = query.order_by(ChatSession.pinned.desc(), ChatSession.updated_at.desc(), ChatSession.id)
    return db.scalars(page.limit(limit).offset(offset)).all(), total


def delete_session(db: Session, session: ChatSession) -> None:
    db.delete(session)


def session_messages(db: Session, session_id: str) -> Sequence[Message]:
    """All of a session's messages, every branch, oldest first."""
    return db.scalars(select(Message).where(Message.session_id == session_id).order_by(Message.id)).all()


def branch(db: Session, session_id: str, tip_id: int | None = None) -> list[Message]:
    """The messages from the root to `tip_id` (default: the newest message, i.e. the active branch)."""
    by_id = {message.id: message for message in session_messages(db, session_id)}
    tip = tip_id if tip_id is not None else max(by_id, default=None)
    path = []
    while tip is not None:
        path.append(by_id[tip])
        tip = by_id[tip].parent_id
    return path[::-1]


def has_messages(db: Session, session_id: str) -> bool:
    return bool(db.scalar(select(exists().where(Message.session_id == session_id))))


# --- Messages of a turn ---


def add_message(
    db: Session, session: ChatSession, parent_id: int | None, role: str, content: str, **fields
) -> Message:
    message = Message(session_id=session.id, parent_id=parent_id, role=role, content=content, **fields)
    db.add(message)
    session.updated_at = utcnow()
    db.flush()
    return message


def set_context(db: Session, message_id: int, context: list[dict] | None, retrieval: dict | None) -> None:
    db.execute(update(Message).where(Message.id == message_id).values(context=context, retrieval=retrieval))


def save_reply_progress(db: Session, reply_id: int, content: str) -> None:
    # Guarded by status, so a late progress write can never undo the final one.
    db.execute(
        update(Message)
        .where(Message.id == reply_id, Message.status.in_(UNFINISHED))
        .values(content=content, status=MessageStatus.streaming)
    )


def finish_reply(db: Session, reply_id: int, **fields) -> None:
    db.execute(update(Message).where(Message.id == reply_id).values(replica_id=None, **fields))


def mark_interrupted(db: Session, replica_id: str) -> int:
    """Replies this replica left pending or streaming when it stopped; their partial text stays."""
    result = db.execute(
        update(Message)
        .where(Message.status.in_(UNFINISHED), Message.replica_id == replica_id)
        .values(
            status=MessageStatus.interrupted,
            error="the server stopped before this reply finished",
            replica_id=None,
        )
    )
    return result.rowcount


# --- Session KV records (admin) ---


def admin_session_rows(
    db: Session, owner: str | None, title: str | None, limit: int, offset: int
) -> tuple[list[tuple], int]:
    """Every user's sessions, newest first, as (session, owner name, turns, tokens, KV record or None);
    `owner` and `title` match case-insensitive substrings."""
    turns = (
        select(func.count())
        .where(Message.session_id == ChatSession.id, Message.role == "user")
        .scalar_subquery()
    )
    tokens = (
        select(Message.prompt_tokens + Message.completion_tokens)
        .where(Message.session_id == ChatSession.id, Message.role == "assistant")
        .order_by(Message.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    query = (
        select(ChatSession, User.username, turns, tokens, SessionKvSnapshot)
        .join(User, User.id == ChatSession.owner_id)
        .outerjoin(SessionKvSnapshot, SessionKvSnapshot.session_id == ChatSession.id)
    )
    if owner:
        query = query.where(User.username.ilike(_literal_pattern(owner), "\\"))
    if title:
        query = query.where(ChatSession.title.ilike(_literal_pattern(title), "\\"))
    total = db.scalar(select(func.count()).select_from(query.subquery()))
    page = query.order_by(ChatSession.updated_at.desc(), ChatSession.id).limit(limit).offset(offset)
    return [tuple(row) for row in db.execute(page)], total


def upsert_kv_record(db: Session, session_id: str, **fields) -> None:
    record = db.scalar(select(SessionKvSnapshot).where(SessionKvSnapshot.session_id == session_id))
    if record is None:
        db.add(SessionKvSnapshot(session_id=session_id, **fields))
    else:
        for name, value in fields.items():
            setattr(record, name, value)


def add_eviction_events(db: Session, session_id: str, policy: str, records: list[dict]) -> int:
    """Stores the session memory's eviction records not stored yet (told apart by their time)."""
    stored = {event.details.get("time") for event in eviction_events(db, session_id) if event.details}
    new = [record for record in records if record["time"] not in stored]
    for record in new:
        db.add(
            EvictionEvent(
                session_id=session_id,
                policy=policy,
                num_tokens_before=record["tokens_before"],
                num_tokens_evicted=record["tokens_before"] - record["tokens_after"],
                details={key: record[key] for key in ("time", "tokens_after", "kept_spans")},
                created_at=datetime.fromtimestamp(record["time"], UTC),
            )
        )
    return len(new)


def eviction_events(db: Session, session_id: str) -> Sequence[EvictionEvent]:
    query = select(EvictionEvent).where(EvictionEvent.session_id == session_id)
    return db.scalars(query.order_by(EvictionEvent.created_at, EvictionEvent.id)).all()


def _literal_pattern(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, its % and _ taken literally."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
