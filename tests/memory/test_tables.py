import importlib.util
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import create_engine

from memory.retrieval.tables import metadata

VERSIONS = Path(__file__).parents[2] / "migrations" / "versions"
MIGRATIONS = ["0002_retrieval.py", "0006_collection_encoders.py"]  # the ones that touch these tables


def load(file: str):
    spec = importlib.util.spec_from_file_location(file.removesuffix(".py"), VERSIONS / file)
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    return migration


def test_migrations_create_exactly_the_tables_the_code_declares(tmp_path):
    migrations = [load(file) for file in MIGRATIONS]
    engine = create_engine(f"sqlite:///{tmp_path / 'migrated.sqlite'}")
    with engine.begin() as conn:
        context = MigrationContext.configure(conn)
        with Operations.context(context):
            for migration in migrations:
                migration.upgrade()
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        with Operations.context(context):
            migrations[-1].downgrade()
        assert compare_metadata(MigrationContext.configure(conn), metadata) != []
