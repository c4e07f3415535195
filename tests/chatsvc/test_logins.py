"""UI logins below the HTTP layer: the throttle of failed attempts, a password check whose cost tells no one
which user names exist, logins that end, and user ids that are never reused."""

import statistics
import time
from datetime import timedelta

import pytest
from sqlalchemy import text, update

from chatsvc import crud
from chatsvc.db import create_db_engine, migrate, session_factory
from chatsvc.logins import LoginPolicy, LoginThrottle
from chatsvc.models import Login, Role, utcnow


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failed_logins_are_throttled_per_user_name_and_per_address_within_a_sliding_window():
    clock = Clock()
    throttle = LoginThrottle(LoginPolicy(failures_per_user=3, failures_per_address=5), clock)
    for _ in range(3):
        assert throttle.retry_after("alice", "10.0.0.1") is None
        throttle.attempt("alice", "10.0.0.1")
        clock.now += 60
    assert throttle.retry_after("Alice", "10.0.0.2") == pytest.approx(15 * 60 - 3 * 60)  # names, any case
    assert throttle.retry_after("bob", "10.0.0.1") is None
    for name in ("bob", "carol"):  # the address's fourth and fifth failures, under other names
        throttle.attempt(name, "10.0.0.1")
    assert throttle.retry_after("dave", "10.0.0.1") is not None
    assert throttle.retry_after("dave", "10.0.0.3") is None
    clock.now += 15 * 60  # the window slides past them
    assert throttle.retry_after("alice", "10.0.0.1") is None


def test_a_successful_login_forgives_the_names_failures():
    throttle = LoginThrottle(LoginPolicy(failures_per_user=2), Clock())
    throttle.attempt("alice", "10.0.0.1")
    throttle.attempt("alice", "10.0.0.1")
    assert throttle.retry_after("alice", "10.0.0.1") is not None
    throttle.succeeded("alice", "10.0.0.1")
    assert throttle.retry_after("alice", "10.0.0.1") is None


def test_an_unknown_user_name_costs_as_much_as_a_wrong_password(database):
    with database.begin() as db:
        crud.create_user(db, "alice", password="alice-password-1")

    def seconds(username: str) -> float:
        with database.begin() as db:
            started = time.perf_counter()
            assert crud.user_by_password(db, username, "wrong password") is None
            return time.perf_counter() - started

    seconds("nobody")  # the first unknown name pays for making the decoy hash once
    known = statistics.median(seconds("alice") for _ in range(5))
    unknown = statistics.median(seconds("nobody") for _ in range(5))
    assert unknown > 0.5 * known, f"unknown {unknown * 1000:.1f} ms against known {known * 1000:.1f} ms"


def test_a_disabled_user_has_no_password_login_no_api_key_and_no_running_login(database):
    with database.begin() as db:
        user = crud.create_user(db, "alice", password="alice-password-1")
        _, key = crud.create_api_key(db, user, "k")
        login = crud.create_login(db, user, "token-1", "127.0.0.1", utcnow() + timedelta(hours=1))
        user_id, login_id = user.id, login.id
    with database.begin() as db:
        crud.update_user(db, user_id, password=None, disabled=True, role=None)
    with database.begin() as db:
        assert crud.user_by_password(db, "alice", "alice-password-1") is None
        assert crud.user_by_api_key(db, key) is None
        assert crud.user_by_login(db, login_id) is None and crud.login_by_token(db, "token-1") is None
        crud.update_user(db, user_id, password=None, disabled=False, role=None)
    with database.begin() as db:
        assert crud.user_by_api_key(db, key).username == "alice"
        assert crud.user_by_login(db, login_id) is None  # disabling ended it for good


def test_a_new_password_ends_every_login_and_an_expired_login_is_refused(database):
    with database.begin() as db:
        user = crud.create_user(db, "alice", password="alice-password-1")
        later = utcnow() + timedelta(hours=1)
        first, second = (crud.create_login(db, user, f"token-{n}", None, later).id for n in (1, 2))
    with database.begin() as db:
        assert crud.user_by_login(db, first).username == "alice"
        db.execute(update(Login).where(Login.id == second).values(expires_at=utcnow() - timedelta(seconds=1)))
    with database.begin() as db:
        assert crud.user_by_login(db, second) is None
        crud.update_user(db, user.id, password="alice-password-2", disabled=None, role=Role.admin)
    with database.begin() as db:
        assert crud.user_by_login(db, first) is None
        assert crud.user_by_password(db, "alice", "alice-password-2").role == Role.admin


def test_a_deleted_users_id_is_never_given_to_a_new_user(database):
    with database.begin() as db:
        crud.create_user(db, "first")
        last = crud.create_user(db, "last")
        crud.create_login(db, last, "token-1", None, utcnow() + timedelta(hours=1))
    with database.begin() as db:
        crud.delete_user(db, last.id)
    with database.begin() as db:
        assert crud.login_by_token(db, "token-1") is None
        assert crud.create_user(db, "next").id > last.id


def test_upgrading_an_existing_database_keeps_every_user_and_their_sessions(db_url):
    """The users table is copied to stop SQLite reusing ids; the copy must not cascade to what users own."""
    engine = create_db_engine(db_url)
    migrate(engine, "0003")
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO users (username, role, created_at) VALUES "
                "('alice', 'user', '2026-11-30'), ('bob', 'user', '2026-11-30')"
            )
        )
        bob = connection.execute(text("SELECT id FROM users WHERE username = 'bob'")).scalar_one()
        connection.execute(
            text(
                "INSERT INTO chat_sessions (id, owner_id, title, created_at, updated_at, archived, pinned) "
                "VALUES ('s1', :bob, 'hello', '2026-11-30', '2026-11-30', false, false)"
            ),
            {"bob": bob},
        )
    migrate(engine)
    sessions = session_factory(engine)
    with sessions.begin() as db:
        assert [user.username for user in crud.list_users(db)] == ["alice", "bob"]
        assert crud.find_session(db, bob, "s1").title == "hello"
        crud.delete_user(db, bob)
    with sessions.begin() as db:
        assert crud.create_user(db, "carol").id > bob
    engine.dispose()
