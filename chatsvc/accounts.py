"""Users and their credentials: who an API key belongs to, users made, changed and deleted by admins, each
user's own API keys and password, and the UI's logins (logins.py).  The admin role is checked here, in
require_admin, for every admin call of the service."""

from collections.abc import Sequence

from sqlalchemy.orm import Session, sessionmaker

from chatsvc import crud
from chatsvc.chat_sessions import ChatSessions
from chatsvc.db import in_transaction
from chatsvc.errors import Conflict, Forbidden
from chatsvc.knowledge import KnowledgeBases
from chatsvc.logins import LoginPolicy, Logins, check_password
from chatsvc.models import ApiKey, Role, User
from chatsvc.turn_flow import TurnFlow


def require_admin(user: User) -> None:
    if user.role != Role.admin:
        raise Forbidden("this is for admins")


class Accounts:
    def __init__(
        self,
        db: sessionmaker,
        turns: TurnFlow,
        chat_sessions: ChatSessions,
        knowledge: KnowledgeBases,
        login_policy: LoginPolicy,
    ):
        self.db = db
        self.turns = turns
        self.chat_sessions = chat_sessions
        self.knowledge = knowledge
        self.logins = Logins(db, login_policy)

    async def user_for_api_key(self, key: str) -> User | None:
        """The user holding this API key, unless disabled."""
        return await in_transaction(self.db, crud.user_by_api_key, key)

    # --- a user's own ---

    async def api_keys(self, user: User) -> Sequence[ApiKey]:
        return await in_transaction(self.db, crud.list_api_keys, user)

    async def create_api_key(self, user: User, name: str) -> tuple[ApiKey, str]:
        """The record and the key itself, which is shown once and never stored (only its hash is)."""
        return await in_transaction(self.db, crud.create_api_key, user, name)

    async def delete_api_key(self, user: User, key_id: int) -> None:
        await in_transaction(self.db, crud.delete_api_key, user, key_id)

    async def change_password(self, user: User, current: str, new: str) -> None:
        await self.logins.change_password(user, current, new)

    # --- admins only ---

    async def users(self, admin: User) -> Sequence[User]:
        require_admin(admin)
        return await in_transaction(self.db, crud.list_users)

    async def create_user(
        self, admin: User, username: str, role: Role, password: str | None
    ) -> tuple[User, str]:
        """A new user with a first API key (returned once)."""
        require_admin(admin)
        if password is not None:
            check_password(password)

        def create(db: Session) -> tuple[User, str]:
            user = crud.create_user(db, username, role, password)
            return user, crud.create_api_key(db, user, "first key")[1]

        return await in_transaction(self.db, create)

    async def update_user(
        self,
        admin: User,
        user_id: int,
        password: str | None = None,
        disabled: bool | None = None,
        role: Role | None = None,
    ) -> User:
        """A new password or disabling ends the user's logins; disabling also stops their replies and
        refuses their API keys until they are enabled again."""
        require_admin(admin)
        if user_id == admin.id and (disabled or role == Role.user):
            raise Conflict("admins cannot disable or demote themselves")
        if password is not None:
            check_password(password)
        if disabled:
            session_ids, _ = await in_transaction(self.db, crud.owned_collections, user_id)
            await self.turns.settle_all(session_ids)
        return await in_transaction(self.db, crud.update_user, user_id, password, disabled, role)

    async def delete_user(self, admin: User, user_id: int) -> None:
        """The user with their logins, keys, sessions, messages and knowledge bases, and what the memory
        holds of them.  Their open pages lose access at once: every UI event looks its login up."""
        require_admin(admin)
        if user_id == admin.id:
            raise Conflict("admins cannot delete themselves")
        session_ids, knowledge_base_ids = await in_transaction(self.db, crud.owned_collections, user_id)
        await self.turns.settle_all(session_ids)
        await in_transaction(self.db, crud.delete_user, user_id)
        await self.chat_sessions.forget(session_ids)
        await self.knowledge.forget(knowledge_base_ids)
