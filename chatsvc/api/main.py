"""The API application: database ready, first admin, crash recovery, engine and retriever loading, routes."""

import logging
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from transformers import AutoTokenizer

from chatsvc import crud
from chatsvc.api.errors import BodySizeLimit, install_error_handlers
from chatsvc.api.routes import account, admin, chat, knowledge_bases, messages, sessions, system
from chatsvc.db import create_db_engine, hold_startup_lock, migrate, session_factory
from chatsvc.engines import EngineLoader
from chatsvc.metrics import ServiceMetrics
from chatsvc.models import User
from chatsvc.service import ChatService, ServiceOptions
from chatsvc.settings import Settings
from chatsvc.sources import TurnSources
from chatsvc.turn_flow import TurnLimits
from memory.retrieval import Retriever

log = logging.getLogger(__name__)
ROUTERS = [chat, sessions, messages, knowledge_bases, account, admin, system]
FIRST_ADMIN_FILE = "first-admin.txt"  # in the data dir, mode 0600


def create_api(settings: Settings) -> FastAPI:
    """Everything but the UI.  Fails fast (ValueError, SQLAlchemyError) on a bad model folder or database."""
    engines = EngineLoader(settings)
    database = create_db_engine(settings.database_url())
    migrate(database)
    db = session_factory(database)
    with db.begin() as transaction:
        hold_startup_lock(transaction.connection())
        first_admin = _first_admin(transaction, settings)
        if interrupted := crud.mark_interrupted(transaction, settings.replica_id):
            log.warning(
                "marked %d replies interrupted: the server stopped while generating them", interrupted
            )
    sources = _sources(database, settings)
    service = ChatService(
        db, engines, sources, ServiceMetrics(engines.stats, engines.memory_stats), _options(settings)
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engines.start()  # in a thread: /health answers 503 until the model is loaded
        sources.warm_up()  # the embedding model, in a thread too
        yield
        engines.shutdown()  # writes the sessions' KV to disk
        sources.retriever.close()  # and the retrieval indexes' snapshots
        database.dispose()

    app = FastAPI(title="kvchat", lifespan=lifespan)
    app.state.service = service
    app.state.first_admin = first_admin
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_request_bytes,
        larger={knowledge_bases.UPLOAD_PATH: settings.max_upload_bytes},
    )
    install_error_handlers(app)
    for module in ROUTERS:
        app.include_router(module.router)
    return app


def _options(settings: Settings) -> ServiceOptions:
    limits = TurnLimits(settings.max_active_generations, settings.default_max_tokens, settings.replica_id)
    return ServiceOptions(settings.data_path(), settings.max_file_bytes, limits, settings.login_policy())


def _sources(database: Engine, settings: Settings) -> TurnSources:
    """One retriever for the app; its budgets count tokens with the chat model's tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(settings.model_path())

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    retriever = Retriever(database, settings.data_path(), count_tokens)
    return TurnSources(retriever, settings.context_budget_tokens)


def _first_admin(db: Session, settings: Settings) -> User:
    admin, generated_key, generated_password = crud.ensure_first_admin(db, *settings.first_admin_secrets())
    generated = {"API key": generated_key, "password": generated_password}
    if generated := {what: value for what, value in generated.items() if value}:
        _hand_over(generated, settings.data_path())
    return admin


def _hand_over(generated: dict[str, str], data_dir: Path) -> None:
    """Generated credentials go to the terminal once; where no one watches a terminal (a service whose
    output is logged), to a file only the server's user can read, never to the log."""
    lines = "".join(f"  {what}: {value}\n" for what, value in generated.items())
    if sys.stderr.isatty():
        print(
            f"Created the admin user 'admin', shown only this once:\n{lines}"
            "Choose your own with --admin-password-file and --api-key-file (or KVCHAT_ADMIN_PASSWORD and "
            "KVCHAT_API_KEY).",
            file=sys.stderr,
        )
        return
    path = data_dir / FIRST_ADMIN_FILE
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
        file.write(f"The admin user 'admin':\n{lines}")
    log.warning("created the admin user 'admin'; its generated %s: see %s", " and ".join(generated), path)
