"""A turn's sources: from its session's knowledge base and from the session's own past turns that the model
no longer sees (so a fact that left the prompt or the session's KV can come back; turns of other branches
never do); every finished turn is indexed for later ones.  The retriever (memory.retrieval) is synchronous
and CPU-bound: it always runs in a worker thread.  The collection names of knowledge bases and sessions are
made here and nowhere else."""

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Sequence

from chatsvc.citations import FoundSources, Source
from chatsvc.models import ChatSession, Message
from memory.retrieval import Context, Passage, Retriever

log = logging.getLogger(__name__)
RECENT_MESSAGES = 4  # the latest messages tell a follow-up ("why?") what it is about


def session_collection(session_id: str) -> str:
    return f"session:{session_id}"


def knowledge_base_collection(knowledge_base_id: str) -> str:
    return f"kb:{knowledge_base_id}"


def collections_for(session: ChatSession) -> list[str]:
    kb = [knowledge_base_collection(session.knowledge_base_id)] if session.knowledge_base_id else []
    return [*kb, session_collection(session.id)]


class TurnSources:
    def __init__(self, retriever: Retriever, budget_tokens: int):
        self.retriever = retriever
        self.budget_tokens = budget_tokens

    def warm_up(self) -> None:
        """Load the embedding model in a thread now, so the first question does not wait for it."""
        threading.Thread(target=self._encode_once, name="retriever-warm-up", daemon=True).start()

    def _encode_once(self) -> None:
        try:
            self.retriever.warm_up()
        except Exception:
            log.exception("the embedding model failed to load; retrieval will fail until it does")

    async def find(
        self, query: str, session: ChatSession, history: Sequence[Message], in_view: set[int]
    ) -> FoundSources:
        """Sources for `query`, best first; `history` is the branch before the new message, and `in_view`
        the ids of its messages the model still sees (in_view.py): only the others may come back."""
        recent = [f"{m.role}: {m.content}" for m in history[-RECENT_MESSAGES:] if m.content]
        collections = collections_for(session)
        turn_names = {_turn_key(m.id): f"turn {n} ({m.role})" for n, m in enumerate(history, start=1)}
        out_of_view = {_turn_key(m.id) for m in history if m.id not in in_view}
        started = time.perf_counter()
        context = await asyncio.to_thread(
            self.retriever.build_context,
            query,
            collections,
            recent,
            self.budget_tokens,
            {session_collection(session.id): out_of_view},
        )
        latency_s = time.perf_counter() - started
        # The latest turns are in the prompt already; a passage repeating one of them adds nothing.
        passages = [p for p in context.passages if not any(p.text in turn for turn in recent)]
        passages = [_named(passage, session_collection(session.id), turn_names) for passage in passages]
        sources = [_source(passage) for passage in passages]
        details = _details(context, passages, collections, latency_s)
        details["past_turns"] = {"in_view": len(in_view), "out_of_view": len(out_of_view)}
        return FoundSources(sources, context.intent, details, latency_s)

    async def remember_turn(self, session_id: str, message_id: int, text: str) -> None:
        if text.strip():
            collection = session_collection(session_id)
            await asyncio.to_thread(self.retriever.add_turn, collection, _turn_key(message_id), text)

    async def forget(self, collection: str) -> None:
        await asyncio.to_thread(self.retriever.delete_collection, collection)


def _turn_key(message_id: int) -> str:
    return f"message {message_id}"


def _named(passage: Passage, collection: str, turn_names: dict[str, str]) -> Passage:
    """A past turn is named by its place in the branch ("turn 3 (user)") rather than its message id."""
    if passage.collection == collection:
        return dataclasses.replace(passage, document_name=turn_names[passage.document_name])
    return passage


def _source(passage: Passage) -> Source:
    ref = {
        "document_id": passage.document_id,
        "paragraph_ids": passage.paragraph_ids,
        "heading": passage.heading,
    }
    return Source(passage.document_name, passage.text, ref)


def _details(context: Context, passages: list[Passage], collections: list[str], latency_s: float) -> dict:
    return {
        "intent": context.intent,
        "intent_reason": context.intent_reason,
        "collections": collections,
        "budget_tokens": context.budget_tokens,
        "num_tokens": context.num_tokens,
        "latency_ms": round(latency_s * 1000, 1),
        "turns": len(context.turns),
        "passages": [
            {
                "n": n,
                "document_name": p.document_name,
                "paragraph_ids": p.paragraph_ids,
                "reason": p.reason,
                "score": p.score,
                "num_tokens": p.num_tokens,
            }
            for n, p in enumerate(passages, start=1)
        ],
    }
