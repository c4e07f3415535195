"""What the API and the UI call: one object per part of the chat service, each given what it needs here.

turns           the turn flow: send, edit, regenerate, stop (turn_flow.py)
chat_sessions   a user's sessions and messages (chat_sessions.py)
knowledge       knowledge bases and their documents (knowledge.py)
accounts        users, API keys, passwords, UI logins (accounts.py, logins.py)
admin           every session's KV, the engine panel (admin.py)
"""

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import sessionmaker

from chatsvc.accounts import Accounts
from chatsvc.admin import Admin
from chatsvc.chat_sessions import ChatSessions
from chatsvc.engines import EngineLoader
from chatsvc.knowledge import KnowledgeBases
from chatsvc.kv_records import KvRecords
from chatsvc.logins import LoginPolicy
from chatsvc.metrics import ServiceMetrics
from chatsvc.sources import TurnSources
from chatsvc.turn_flow import TurnFlow, TurnLimits


@dataclass
class ServiceOptions:
    data_dir: Path
    max_file_bytes: int  # largest knowledge-base document
    turn_limits: TurnLimits
    login_policy: LoginPolicy


class ChatService:
    def __init__(
        self,
        db: sessionmaker,
        engines: EngineLoader,
        sources: TurnSources,
        metrics: ServiceMetrics,
        options: ServiceOptions,
    ):
        self.db = db
        self.engines = engines
        self.sources = sources
        self.metrics = metrics
        kv_records = KvRecords(db, options.data_dir)
        self.turns = TurnFlow(db, engines, sources, kv_records, metrics, options.turn_limits)
        self.chat_sessions = ChatSessions(db, self.turns, engines, sources)
        self.knowledge = KnowledgeBases(db, sources, options.max_file_bytes)
        self.accounts = Accounts(db, self.turns, self.chat_sessions, self.knowledge, options.login_policy)
        self.admin = Admin(db, engines, self.turns, kv_records)
