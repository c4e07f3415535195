"""The API application: database ready, first admin, crash recovery, engine loading, routes."""

import logging
import sys
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.orm import Session

from chatsvc import crud
from chatsvc.api.errors import BodySizeLimit, install_error_handlers
from chatsvc.api.routes import account, admin, chat, knowledge_bases, messages, sessions, system
from chatsvc.context import NoContext
from chatsvc.db import create_db_engine, hold_startup_lock, migrate, session_factory
from chatsvc.engines import EngineLoader
from chatsvc.metrics import ServiceMetrics
from chatsvc.models import User
from chatsvc.service import ChatService
from chatsvc.settings import Settings

log = logging.getLogger(__name__)
ROUTERS = [chat, sessions, messages, knowledge_bases, account, admin, system]


def create_api(settings: Settings) -> FastAPI:
    """Everything but the UI.  Fails fast (ValueError, SQLAlchemyError) on a bad model folder or database."""
    engines = EngineLoader(settings)
    database = create_db_engine(settings.database_url())
    migrate(database)
    sessions = session_factory(database)
    with sessions.begin() as db:
        hold_startup_lock(db.connection())
        first_admin = _first_admin(db, settings)
        if interrupted := crud.mark_interrupted(db, settings.replica_id):
            log.warning(
                "marked %d replies interrupted: the server stopped while generating them", interrupted
            )
    service = ChatService(
        sessions,
        engines,
        NoContext(),
        ServiceMetrics(engines.stats),
        max_active_generations=settings.max_active_generations,
        default_max_tokens=settings.default_max_tokens,
        replica_id=settings.replica_id,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engines.start()  # in a thread: /health answers 503 until the model is loaded
        yield
        engines.shutdown()
        database.dispose()

    app = FastAPI(title="kvchat", lifespan=lifespan)
    app.state.service = service
    app.state.first_admin = first_admin
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    install_error_handlers(app)
    for module in ROUTERS:
        app.include_router(module.router)
    return app


def _first_admin(db: Session, settings: Settings) -> User:
    admin, generated_key = crud.ensure_first_admin(db, settings.api_key, settings.admin_password)
    if generated_key:
        print(
            f"Created the admin user 'admin' with API key {generated_key}\n"
            "It is shown only this once; start with --api-key KEY to choose your own.",
            file=sys.stderr,
        )
    return admin
