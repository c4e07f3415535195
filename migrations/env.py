"""Alembic environment: the app passes its connection (chatsvc.db.migrate); the CLI uses the settings' URL."""

from alembic import context

from chatsvc.db import create_db_engine
from chatsvc.models import Base
from chatsvc.settings import Settings


def target_metadata() -> list:
    metadata = [Base.metadata]
    try:  # the retriever's tables (documents, paragraphs), once memory/retrieval exists
        from memory.retrieval.tables import metadata as retrieval_metadata
    except ModuleNotFoundError as error:
        if not (error.name or "").startswith("memory"):
            raise
    else:
        metadata.append(retrieval_metadata)
    return metadata


def run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata(),
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    run(connection)
else:
    url = context.config.get_main_option("sqlalchemy.url") or Settings().database_url()
    with create_db_engine(url).begin() as connection:
        run(connection)
