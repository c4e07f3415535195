"""Database connection and migrations: any SQLAlchemy URL (SQLite by default, Postgres for replicas)."""

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
    if make_url(url).get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, **POOL)
    engine = create_engine(url, connect_args={"timeout": 30}, **POOL)
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection, connection_record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")  # off by default in SQLite; cascades depend on it
    cursor.execute("PRAGMA journal_mode=WAL")  # readers do not wait for the streaming writers
    cursor.close()


def session_factory(engine: Engine) -> sessionmaker:
    # Rows stay readable after commit: the turn flow hands them across threads and tasks.
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision`; safe to run from several replicas at once on Postgres."""
    with engine.begin() as connection:
        hold_startup_lock(connection)
        command.upgrade(alembic_config(connection), revision)


def hold_startup_lock(connection: Connection) -> None:
    """Replicas starting together take turns (until the transaction ends) at migrating and setting up."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": STARTUP_LOCK_ID})


def redacted(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)
