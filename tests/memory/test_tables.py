import importlib.util
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import create_engine

from memory.retrieval.tables import metadata

MIGRATION = Path(__file__).parents[2] / "migrations" / "versions" / "0002_retrieval.py"


def test_migration_creates_exactly_the_tables_the_code_declares(tmp_path):
    spec = importlib.util.spec_from_file_location("retrieval_migration", MIGRATION)
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    assert (migration.revision, migration.down_revision) == ("0002", "0001")
    engine = create_engine(f"sqlite:///{tmp_path / 'migrated.sqlite'}")
    with engine.begin() as conn:
        context = MigrationContext.configure(conn)
        with Operations.context(context):
            migration.upgrade()
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        with Operations.context(context):
            migration.downgrade()
        assert compare_metadata(MigrationContext.configure(conn), metadata) != []
