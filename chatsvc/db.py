"""Database connection and migrations: any SQLAlchemy URL (SQLite by default, Postgres for replicas)."""

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.orm import sessionmaker

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
STARTUP_LOCK_ID = 72_657_613  # any constant, the same for every replica


# Enough connections for every request thread (anyio's 40) and the turn flow's workers at once.
POOL = {"pool_size": 5, "max_overflow": 45}


def create_db_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, **POOL)
    if parsed.database and parsed.database != ":memory:":
        _create_private(Path(parsed.database))
    engine = create_engine(url, connect_args={"timeout": 30}, **POOL)
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _create_private(path: Path) -> None:
    """A new SQLite file readable by the server's user only; its -wal and -shm files take the same mode."""
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


def _sqlite_pragmas(dbapi_connection, connection_record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")  # off by default in SQLite; cascades depend on it
    cursor.execute("PRAGMA journal_mode=WAL")  # readers do not wait for the streaming writers
    cursor.close()


def session_factory(engine: Engine) -> sessionmaker:
    # Rows stay readable after commit: the turn flow hands them across threads and tasks.
    return sessionmaker(engine, expire_on_commit=False)


async def in_transaction(sessions: sessionmaker, work: Callable, *args, **kwargs):
    """`work(db, ...)` in a worker thread, in one transaction."""

    def run():
        with sessions.begin() as db:
            return work(db, *args, **kwargs)

    return await asyncio.to_thread(run)


def alembic_config(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision`; safe to run from several replicas at once on Postgres."""
    with engine.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:  # SQLite alters a table by copying it; dropping the old copy must not cascade
            _sqlite_foreign_keys(connection, on=False)
        try:
            with connection.begin():
                hold_startup_lock(connection)
                command.upgrade(alembic_config(connection), revision)
                if sqlite and (broken := connection.exec_driver_sql("PRAGMA foreign_key_check").all()):
                    raise RuntimeError(f"the migration left rows with dangling foreign keys: {broken[:5]}")
        finally:
            if sqlite:
                _sqlite_foreign_keys(connection, on=True)


def _sqlite_foreign_keys(connection: Connection, on: bool) -> None:
    """Only takes effect outside a transaction, hence the commit."""
    connection.exec_driver_sql(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
    connection.commit()


def hold_startup_lock(connection: Connection) -> None:
    """Replicas starting together take turns (until the transaction ends) at migrating and setting up."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": STARTUP_LOCK_ID})


def redacted(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)
