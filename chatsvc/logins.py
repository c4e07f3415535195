"""Logging in to the UI: a password check that costs the same for unknown names, failed attempts throttled
per user name and per client address, and logins kept in the database so that they can end at once."""

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from chatsvc import crud
from chatsvc.db import in_transaction
from chatsvc.errors import InvalidCredentials, TooManyAttempts
from chatsvc.models import User, utcnow
from chatsvc.security import new_login_token

log = logging.getLogger(__name__)


PASSWORD_MIN, PASSWORD_MAX = 8, 200


def check_password(password: str) -> None:
    if not PASSWORD_MIN <= len(password) <= PASSWORD_MAX:
        raise ValueError(f"a password is {PASSWORD_MIN} to {PASSWORD_MAX} characters")


@dataclass
class LoginPolicy:
    lifetime_hours: float = 7 * 24  # a login ends by itself this long after it began
    window_minutes: float = 15  # failed attempts count this long
    failures_per_user: int = 10  # within the window, then that user name waits
    failures_per_address: int = 50  # within the window, then that client address waits


class LoginThrottle:
    """Attempts in a sliding window per user name and per client address.  An attempt counts as failed
    until it succeeds, so that many attempts at once cannot all slip in before the first one fails."""

    MAX_KEYS = 100_000  # past this, keys with no attempt inside the window are forgotten

    def __init__(self, policy: LoginPolicy, clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self.clock = clock
        self.attempts: dict[str, deque[float]] = {}

    def retry_after(self, username: str, address: str) -> float | None:
        """Seconds until this name and address may try again; None when they may now."""
        wait = max(
            self._wait(_user_key(username), self.policy.failures_per_user),
            self._wait(_address_key(address), self.policy.failures_per_address),
        )
        return wait if wait > 0 else None

    def attempt(self, username: str, address: str) -> None:
        now = self.clock()
        for key in (_user_key(username), _address_key(address)):
            self.attempts.setdefault(key, deque()).append(now)
        if len(self.attempts) > self.MAX_KEYS:
            self._forget_stale(now)

    def succeeded(self, username: str, address: str) -> None:
        """The name's failures are forgiven; the address keeps its other attempts."""
        self.attempts.pop(_user_key(username), None)
        if times := self.attempts.get(_address_key(address)):
            times.pop()

    def _wait(self, key: str, limit: int) -> float:
        times = self.attempts.get(key)
        if not times:
            return 0.0
        window = self.policy.window_minutes * 60
        now = self.clock()
        while times and times[0] <= now - window:
            times.popleft()
        return 0.0 if len(times) < limit else times[-limit] + window - now

    def _forget_stale(self, now: float) -> None:
        horizon = now - self.policy.window_minutes * 60
        for key in [key for key, times in self.attempts.items() if not times or times[-1] <= horizon]:
            del self.attempts[key]


def _user_key(username: str) -> str:
    return f"user:{username.lower()}"


def _address_key(address: str) -> str:
    return f"address:{address}"


class Logins:
    def __init__(self, sessions: sessionmaker, policy: LoginPolicy):
        self.sessions = sessions
        self.policy = policy
        self.throttle = LoginThrottle(policy)

    async def log_in(self, username: str, password: str, address: str) -> str:
        """A new login's token (for the browser's cookie); raises TooManyAttempts or InvalidCredentials."""
        if (wait := self.throttle.retry_after(username, address)) is not None:
            log.warning("refused a login as %r from %s: too many failed attempts", username, address)
            raise TooManyAttempts(math.ceil(wait))
        self.throttle.attempt(username, address)
        token = new_login_token()
        if not await self._in_db(self._create, username, password, token, address):
            log.info("failed login as %r from %s", username, address)
            raise InvalidCredentials("wrong user name or password")
        self.throttle.succeeded(username, address)
        return token

    async def login_id(self, token: str) -> str | None:
        """The login holding this cookie token, while it lasts and its user may log in."""
        login = await self._in_db(crud.login_by_token, token)
        return login.id if login is not None else None

    async def user(self, login_id: str) -> User | None:
        """Looked up anew for every UI event: a deleted or disabled user, or an ended login, is refused."""
        return await self._in_db(crud.user_by_login, login_id)

    async def log_out(self, token: str) -> None:
        await self._in_db(crud.end_login, token)

    async def change_password(self, user: User, current: str, new: str) -> None:
        """Ends every login of the user, this one's too; raises InvalidCredentials for a wrong current one."""
        check_password(new)

        def change(db: Session) -> None:
            if crud.user_by_password(db, user.username, current) is None:
                raise InvalidCredentials("the current password is wrong")
            crud.update_user(db, user.id, password=new, disabled=None, role=None)

        await self._in_db(change)

    def _create(self, db: Session, username: str, password: str, token: str, address: str) -> bool:
        user = crud.user_by_password(db, username, password)
        if user is None:
            return False
        crud.delete_expired_logins(db)
        crud.create_login(db, user, token, address, utcnow() + timedelta(hours=self.policy.lifetime_hours))
        return True

    async def _in_db(self, work: Callable, *args):
        return await in_transaction(self.sessions, work, *args)
