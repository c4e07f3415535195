"""The turn flow: a user message becomes a stored user message, a pending reply, the turn's sources, a
prompt, a streamed reply saved as it grows, and finally usage, citations and metrics; after the reply, the
turn is indexed for retrieval and its session's KV recorded.  Engine-agnostic: session-KV steps run only
where the engine has a session memory."""

import asyncio
import contextlib
import functools
import itertools
import logging
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from chatsvc import crud, prompts
from chatsvc.citations import citations, numbered
from chatsvc.db import in_transaction
from chatsvc.engines import EngineLoader, session_memory
from chatsvc.errors import Conflict, EngineFailed, QueueFull
from chatsvc.in_view import messages_in_view
from chatsvc.kv_records import KvRecords
from chatsvc.load_monitor import LoadMonitor
from chatsvc.metrics import ServiceMetrics
from chatsvc.models import UNFINISHED, ChatSession, Message, MessageStatus, User
from chatsvc.sources import TurnSources
from chatsvc.turns import Progress, Turn, TurnOptions, TurnResult
from engine.protocol import EngineClient
from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)
FLUSH_INTERVAL_S = 0.5  # a streaming reply is saved at least this often
QUEUE_RETRY_AFTER_S = 2
TITLE_LENGTH = 60


@dataclass
class TurnLimits:
    max_active_generations: int  # replies generating or queued at once; more are refused (429)
    default_max_tokens: int  # a reply's length where the request names none
    replica_id: str  # marks the replies this replica generates, for crash recovery


@dataclass
class KvOptions:
    budget_tokens: int | None  # the session's own budget; None: the session memory's default
    protected_tokens: int  # the system prompt's tokens, never evicted


class TurnFlow:
    """Runs turns for many users at once; every database and retriever step runs in a worker thread."""

    def __init__(
        self,
        db: sessionmaker,
        engines: EngineLoader,
        sources: TurnSources,
        kv_records: KvRecords,
        metrics: ServiceMetrics,
        limits: TurnLimits,
    ):
        self.db = db
        self.engines = engines
        self.sources = sources
        self.kv_records = kv_records
        self.metrics = metrics
        self.limits = limits
        self.monitor = LoadMonitor()
        # One reply at a time per session keeps the history linear; None while the turn is being prepared.
        self.busy_sessions: dict[str, Turn | None] = {}
        self.after_turns: dict[str, asyncio.Task] = {}  # indexing and KV records, after the reply

    async def start_session(
        self,
        user: User,
        content: str,
        options: TurnOptions,
        system_prompt: str | None = None,
        knowledge_base_id: str | None = None,
        history: Sequence[tuple[str, str]] = (),
    ) -> Turn:
        """A new stored session holding a client's earlier messages (role, content) and the new one."""
        _check_content(content)
        self._admit()

        def store(db: Session) -> str:
            session = crud.create_session(db, user.id, system_prompt=system_prompt)
            _attach_knowledge_base(db, session, knowledge_base_id)
            parent_id = None
            for role, text in history:
                parent_id = crud.add_message(db, session, parent_id, role, text).id
            return session.id

        return await self.send(user, await self._in_db(store), content, options)

    async def send(
        self,
        user: User,
        session_id: str,
        content: str,
        options: TurnOptions,
        knowledge_base_id: str | None = None,
    ) -> Turn:
        """Continue the session's active branch with a new user message."""
        _check_content(content)

        def prepare(db: Session) -> tuple[ChatSession, list[Message]]:
            session = crud.find_session(db, user.id, session_id)
            _attach_knowledge_base(db, session, knowledge_base_id)
            return session, crud.branch(db, session.id)

        return await self._start(*await self._in_db(prepare), content, options)

    async def edit(self, user: User, message_id: int, content: str, options: TurnOptions) -> Turn:
        """A new branch: the edited user message beside the original, and a reply to it."""
        _check_content(content)

        def prepare(db: Session) -> tuple[ChatSession, list[Message]]:
            original = crud.find_message(db, user.id, message_id)
            if original.role != "user":
                raise ValueError(f"message {message_id} is not a user message; only those can be edited")
            session = crud.find_session(db, user.id, original.session_id)
            return session, crud.branch(db, session.id, original.parent_id) if original.parent_id else []

        return await self._start(*await self._in_db(prepare), content, options)

    async def regenerate(self, user: User, message_id: int, options: TurnOptions) -> Turn:
        """A new branch: another reply to the same user message, with the same sources."""

        def prepare(db: Session) -> tuple[ChatSession, list[Message]]:
            original = crud.find_message(db, user.id, message_id)
            if original.role != "assistant":
                raise ValueError(f"message {message_id} is not a reply; only replies can be regenerated")
            session = crud.find_session(db, user.id, original.session_id)
            return session, crud.branch(db, session.id, original.parent_id)

        return await self._start(*await self._in_db(prepare), None, options)

    async def stop(self, user: User, session_id: str) -> bool:
        """Stop the session's generating reply (stored as aborted); False when none was generating."""
        await self._in_db(crud.find_session, user.id, session_id)
        turn = self.busy_sessions.get(session_id)
        if turn is None or not turn.generating:
            return False
        turn.cancel()
        await turn.result()
        return True

    def _admit(self) -> EngineClient:
        engine = self.engines.ready()
        if len(self.busy_sessions) >= self.limits.max_active_generations:
            raise QueueFull(self.limits.max_active_generations, QUEUE_RETRY_AFTER_S)
        return engine

    async def _start(
        self, session: ChatSession, path: list[Message], content: str | None, options: TurnOptions
    ) -> Turn:
        """Store the new user message (none when regenerating) and a pending reply, then start generating."""
        started = time.perf_counter()
        if session.id in self.busy_sessions or (path and path[-1].status in UNFINISHED):
            raise Conflict(f"session {session.id} is still generating a reply; wait for it or cancel it")
        engine = self._admit()
        params = self._sampling_params(session, options)
        self.busy_sessions[session.id] = None
        try:
            turn = await self._store_turn(session, path, content, engine.model_name, started)
            prompt, sources, protected = await self._prepare(
                turn, engine, session, path, content, params.max_tokens
            )
        except BaseException:
            self.busy_sessions.pop(session.id, None)
            raise
        kv = KvOptions(session.kv_budget_tokens, protected)
        turn.task = asyncio.create_task(self._generate(turn, engine, prompt, params, sources, kv))
        self.busy_sessions[session.id] = turn
        return turn

    async def _store_turn(
        self, session: ChatSession, path: list[Message], content: str | None, model_name: str, started: float
    ) -> Turn:
        """Appends the new user message to `path` (in place) and stores it and the pending reply."""

        def store(db: Session) -> Turn:
            stored = crud.find_session(db, session.owner_id, session.id)
            if content is not None:
                path.append(crud.add_message(db, stored, path[-1].id if path else None, "user", content))
            if not stored.title:
                stored.title = make_title(next(m.content for m in path if m.role == "user"))
            reply = crud.add_message(
                db,
                stored,
                path[-1].id,
                "assistant",
                "",
                status=MessageStatus.pending,
                replica_id=self.limits.replica_id,
            )
            return Turn(stored.id, path[-1].id, reply.id, model_name, started, content)

        return await self._in_db(store)

    async def _prepare(
        self,
        turn: Turn,
        engine: EngineClient,
        session: ChatSession,
        path: list[Message],
        content: str | None,
        max_tokens: int,
    ) -> tuple[str, list[dict], int]:
        """This turn's prompt, sources (fetched for a new message, reused when regenerating) and system
        prompt length in tokens.  If that fails, the stored reply says why."""
        try:
            limit = engine.max_model_len - max_tokens
            if content is not None:
                await self._retrieve(engine, session, path, limit)
            prompt, protected = await asyncio.to_thread(
                _render, engine.tokenizer, session.system_prompt, path, limit
            )
        except BaseException as error:
            failure = str(error) if isinstance(error, ValueError) else "preparing the prompt failed"
            reply_failed = self._in_db(
                crud.finish_reply, turn.reply_id, status=MessageStatus.error, error=failure
            )
            await asyncio.shield(reply_failed)
            raise
        return prompt, path[-1].context or [], protected

    async def _retrieve(
        self, engine: EngineClient, session: ChatSession, path: list[Message], limit: int
    ) -> None:
        """Sources for the new user message (the last of `path`), stored with it."""
        question = path[-1]
        try:
            in_view = await messages_in_view(engine, session, path, limit)
            found = await self.sources.find(question.content, session, path[:-1], in_view)
        except Exception:  # a reply without sources beats no reply
            log.exception("retrieving sources for message %s failed", question.id)
            return
        self.metrics.retrieval_latency.labels(found.intent).observe(found.latency_s)
        question.context, question.retrieval = numbered(found.sources) or None, found.details
        await self._in_db(crud.set_context, question.id, question.context, question.retrieval)

    def _sampling_params(self, session: ChatSession, options: TurnOptions) -> SamplingParams:
        temperature = options.temperature if options.temperature is not None else session.temperature
        return SamplingParams(
            temperature=1.0 if temperature is None else temperature,
            top_p=options.top_p,
            max_tokens=options.max_tokens or self.limits.default_max_tokens,
            stop=options.stop,
            seed=options.seed,
        )

    async def _generate(
        self,
        turn: Turn,
        engine: EngineClient,
        prompt: str,
        params: SamplingParams,
        sources: list[dict],
        kv: KvOptions,
    ) -> TurnResult:
        progress = Progress(started=turn.started)
        saver = asyncio.create_task(self._save_periodically(turn.reply_id, progress))
        status, error = MessageStatus.done, None
        try:
            if (memory := session_memory(engine)) is not None:
                memory.open_session(turn.session_id, kv.budget_tokens, kv.protected_tokens)
            stream = engine.generate(
                prompt, params, request_id=str(turn.reply_id), session_id=turn.session_id
            )
            async for delta in stream:
                if (gap := progress.add(delta, time.perf_counter())) is not None:
                    self.metrics.inter_token_latency.observe(gap)
                if delta.text:
                    turn.pieces.put_nowait(delta.text)
            if progress.finish_reason == "abort":
                status = MessageStatus.aborted
        except asyncio.CancelledError:
            status, progress.finish_reason = MessageStatus.aborted, "abort"
            with contextlib.suppress(ValueError):  # unknown id: the stream's own cleanup got there first
                await engine.abort(str(turn.reply_id))
        except ValueError as caller_error:
            status, error = MessageStatus.error, caller_error
        except Exception:
            log.exception("generating reply %s failed", turn.reply_id)
            status, error = MessageStatus.error, EngineFailed("the engine failed while generating this reply")
        finally:
            turn.generating = False
            saver.cancel()
        # Shielded: a second cancel must not keep the finished reply from being stored.
        return await asyncio.shield(self._finish(turn, engine, progress, status, error, sources))

    async def _finish(
        self,
        turn: Turn,
        engine: EngineClient,
        progress: Progress,
        status: MessageStatus,
        error: Exception | None,
        sources: list[dict],
    ) -> TurnResult:
        text = progress.text()
        result = TurnResult(
            status, progress.finish_reason, text, progress.usage, citations(sources, text), error
        )
        try:
            await self._in_db(
                crud.finish_reply,
                turn.reply_id,
                status=status,
                error=str(error) if error else None,
                citations=result.citations or None,
                **progress.stored_fields(),
            )
        except Exception:  # the reply stays 'streaming' and is marked interrupted at the next start
            log.exception("storing the finished reply %s failed", turn.reply_id)
        finally:
            self.busy_sessions.pop(turn.session_id, None)  # only now may the session's next turn read it
            turn.pieces.put_nowait(None)
        self._observe(progress, result)
        self._after_turn_soon(turn, engine, result)
        return result

    def _after_turn_soon(self, turn: Turn, engine: EngineClient, result: TurnResult) -> None:
        """Index the turn and record its session's KV once the reply is out; a session's in turn order."""
        previous = self.after_turns.get(turn.session_id)
        task = asyncio.create_task(self._after_turn(previous, turn, engine, result))
        self.after_turns[turn.session_id] = task
        task.add_done_callback(functools.partial(self._after_turn_done, turn.session_id))

    def _after_turn_done(self, session_id: str, task: asyncio.Task) -> None:
        if self.after_turns.get(session_id) is task:
            del self.after_turns[session_id]

    async def _after_turn(
        self, previous: asyncio.Task | None, turn: Turn, engine: EngineClient, result: TurnResult
    ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        try:
            if turn.question is not None:
                await self.sources.remember_turn(turn.session_id, turn.user_message_id, turn.question)
            if result.status in (MessageStatus.done, MessageStatus.aborted):
                await self.sources.remember_turn(turn.session_id, turn.reply_id, result.text)
        except Exception:
            log.exception("indexing a turn of session %s failed", turn.session_id)
        if (memory := session_memory(engine)) is not None:
            try:
                await self.kv_records.record(memory, turn.session_id, turn.reply_id)
            except Exception:
                log.exception("recording the KV of session %s failed", turn.session_id)

    async def settle(self, session_id: str) -> None:
        """Stop the session's reply if one is generating; wait for it and for what follows it."""
        if session_id in self.busy_sessions and self.busy_sessions[session_id] is None:
            raise Conflict(f"session {session_id} is starting a reply; try again in a moment")
        if (turn := self.busy_sessions.get(session_id)) is not None:
            turn.cancel()
            await turn.result()
        if (task := self.after_turns.get(session_id)) is not None:
            await asyncio.wait([task])

    def _observe(self, progress: Progress, result: TurnResult) -> None:
        if progress.first_token_at is not None:
            self.metrics.time_to_first_token.observe(progress.first_token_at - progress.started)
            self.monitor.record_ttft(progress.first_token_at - progress.started)
        self.metrics.e2e_request_latency.observe(time.perf_counter() - progress.started)
        reason = "error" if result.status == MessageStatus.error else (result.finish_reason or "stop")
        self.metrics.request_success.labels(reason).inc()

    async def _save_periodically(self, reply_id: int, progress: Progress) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            text = progress.text()
            if len(text) > progress.saved_length:
                progress.saved_length = len(text)
                await self._in_db(crud.save_reply_progress, reply_id, text)

    async def settle_all(self, session_ids: list[str]) -> None:
        for session_id in session_ids:
            with contextlib.suppress(Conflict):  # one still starting a reply: what follows goes anyway
                await self.settle(session_id)

    def generating(self, session_id: str) -> bool:
        return session_id in self.busy_sessions

    async def _in_db(self, work: Callable, *args, **kwargs):
        return await in_transaction(self.db, work, *args, **kwargs)


def _render(tokenizer, system_prompt: str | None, path: list[Message], limit: int) -> tuple[str, int]:
    prompt = prompts.fit_prompt(tokenizer, system_prompt, path, limit)
    return prompt, prompts.system_prefix_tokens(tokenizer, system_prompt)


def make_title(text: str) -> str:
    """A session's title from its first user message: one line of at most TITLE_LENGTH columns (a Chinese
    character takes two), cut after the last space or Chinese punctuation that fits, else where it fills."""
    words = " ".join(text.split())
    widths = itertools.accumulate(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in words)
    fits = sum(1 for width in widths if width <= TITLE_LENGTH)
    if fits == len(words):
        return words
    head = words[:fits]
    cut = max(head.rfind(mark) for mark in " ，。？！、；：")
    return (head[:cut] if cut > 0 else head) + "…"


def _check_content(content: str) -> None:
    if not content.strip():
        raise ValueError("the message is empty")


def _attach_knowledge_base(db: Session, session: ChatSession, knowledge_base_id: str | None) -> None:
    if knowledge_base_id is not None:
        session.knowledge_base_id = crud.find_knowledge_base(db, session.owner_id, knowledge_base_id).id
