"""The session manager's rules: titles, grouping by age, which settings may change and how."""

from datetime import datetime

from sqlalchemy.orm import Session

from chatsvc import crud
from chatsvc.errors import Conflict
from chatsvc.models import ChatSession, User
from chatsvc.settings import MIN_SESSION_BUDGET_TOKENS

TITLE_LENGTH = 60


def make_title(text: str) -> str:
    """A session's title from its first user message: one line, cut at a word."""
    words = " ".join(text.split())
    if len(words) <= TITLE_LENGTH:
        return words
    return (words[:TITLE_LENGTH].rsplit(" ", 1)[0] or words[:TITLE_LENGTH]) + "…"


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


def create_session(db: Session, owner: User, **settings) -> ChatSession:
    _check_kv_budget(settings.get("kv_budget_tokens"))
    if settings.get("knowledge_base_id"):
        crud.find_knowledge_base(db, owner.id, settings["knowledge_base_id"])
    return crud.create_session(db, owner.id, **settings)


def update_session(db: Session, session: ChatSession, changes: dict) -> ChatSession:
    """Rename, archive, pin, or change settings.  The system prompt is fixed once a session has messages:
    changing it would rewrite the start of every later prompt and discard the session's cached KV."""
    new_prompt = changes.get("system_prompt", session.system_prompt)
    if new_prompt != session.system_prompt and crud.has_messages(db, session.id):
        raise Conflict("the system prompt cannot change once a session has messages; start a new session")
    _check_kv_budget(changes.get("kv_budget_tokens"))
    if changes.get("knowledge_base_id"):
        crud.find_knowledge_base(db, session.owner_id, changes["knowledge_base_id"])
    for name, value in changes.items():
        setattr(session, name, value)
    db.flush()
    return session


def _check_kv_budget(tokens: int | None) -> None:
    if tokens is not None and tokens < MIN_SESSION_BUDGET_TOKENS:
        raise ValueError(
            f"kv_budget_tokens must be at least {MIN_SESSION_BUDGET_TOKENS}: the session memory always "
            "keeps a session's first and most recent tokens"
        )
