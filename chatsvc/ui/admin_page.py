"""The admin page (admins only): every session with its KV, one session in detail (conversation, KV
figures, token importance over positions with what was kept, eviction timeline, retrieval events), the
actions persist / evict / drop on its KV, and the engine panel.  Every handler checks the admin role
itself, so a non-admin calling these events gets refused, not just a hidden page."""

import gradio as gr
import pandas as pd

from chatsvc.models import Message
from chatsvc.ui import html
from chatsvc.ui.engine_panel import EnginePanelView
from chatsvc.ui.identity import shows_errors
from chatsvc.ui.page import Page
from chatsvc.views import KvState, SessionKvDetail, SessionKvRow

SESSION_COLUMNS = [
    "Title",
    "Owner",
    "Turns",
    "Tokens",
    "KV in",
    "KV cached",
    "KV evicted",
    "On disk",
    "Last activity",
]
EVICTION_COLUMNS = ["Time", "Policy", "Tokens before", "Evicted", "After", "Kept spans"]


def session_rows(rows: list[SessionKvRow]) -> list[list]:
    def number(value: int | None) -> str:
        return "–" if value is None else str(value)

    return [
        [
            r.title or "(untitled)",
            r.owner,
            r.turns,
            number(r.tokens),
            "generating" if r.generating else (r.kv_location or "–"),
            number(r.kv_cached_tokens),
            number(r.kv_evicted_tokens),
            html.size(r.kv_bytes_on_disk),
            r.last_activity.strftime("%Y-%m-%d %H:%M:%S"),
        ]
        for r in rows
    ]


def kv_figures(kv: KvState) -> str:
    if not kv.available:
        return html.unavailable(f"Session KV: {kv.note}")
    grid = html.stats(
        [
            ("KV in", kv.location),
            ("tokens cached", kv.cached_tokens),
            ("conversation tokens", kv.text_tokens),
            ("tokens evicted", kv.evicted_tokens),
            ("blocks", kv.blocks),
            ("on disk", html.size(kv.bytes_on_disk)),
        ]
    )
    return grid + (html.unavailable(kv.warning) if kv.warning else "")


def importance_frame(kv: KvState) -> pd.DataFrame:
    """Each position of the conversation: the attention its KV slot received, or 0 where it was evicted."""
    kept = dict(zip(kv.positions, kv.importance, strict=True))
    rows = [
        {
            "position": position,
            "importance": kept.get(position, 0.0),
            "slot": "kept" if position in kept else "evicted",
        }
        for position in range(max(kv.text_tokens, max(kept, default=-1) + 1))
    ]
    return pd.DataFrame(rows or None, columns=["position", "importance", "slot"])


def eviction_rows(detail: SessionKvDetail) -> list[list]:
    rows = []
    for event in detail.eviction_events:
        details = event.details or {}
        spans = ", ".join(f"{start}–{end}" for start, end in details.get("kept_spans", []))
        after = details.get("tokens_after", event.num_tokens_before - event.num_tokens_evicted)
        rows.append(
            [
                event.created_at.strftime("%H:%M:%S"),
                event.policy,
                event.num_tokens_before,
                event.num_tokens_evicted,
                after,
                spans,
            ]
        )
    return rows


def retrieval_html(messages: list[Message]) -> str:
    rows = []
    for turn, message in enumerate((m for m in messages if m.role == "user"), start=1):
        event = message.retrieval
        if not event:
            continue
        sources = ", ".join(f"[{p['n']}] {p['document_name']}" for p in event.get("passages", []))
        rows.append(
            [
                turn,
                message.content[:80],
                event.get("intent"),
                event.get("intent_reason"),
                f"{event.get('num_tokens')} / {event.get('budget_tokens')}",
                event.get("latency_ms"),
                sources or "none",
            ]
        )
    if not rows:
        return html.muted("No retrieval in this session (no knowledge base, and no earlier turn was needed).")
    return html.table(
        ["turn", "question", "intent", "why", "tokens / budget", "ms", "sources"], rows, numeric=[0, 5]
    )


def conversation_html(detail: SessionKvDetail) -> str:
    turns = []
    for message in detail.messages:
        meta = f"{message.role} · {message.status.value}"
        if message.role == "assistant" and message.prompt_tokens:
            meta += f" · {message.prompt_tokens} prompt tokens, {message.cached_tokens or 0} reused"
        turns.append(
            f'<div class="kv-turn {html.text(message.role)}"><span class="kv-meta">{html.text(meta)}</span>'
            f"{html.text(message.content)}</div>"
        )
    return "".join(turns) or html.muted("No messages yet.")


class AdminPage(Page):
    def layout(self) -> None:
        self.session_ids = gr.State([])
        self.selected = gr.State(None)
        self.denied = gr.Markdown(visible=False, elem_id="admin-denied")
        with gr.Column(visible=False, elem_id="admin-content") as self.content:
            gr.Markdown("## Sessions")
            with gr.Row(equal_height=True):
                self.owner_filter = gr.Textbox(
                    label="Owner", placeholder="any", scale=2, elem_id="admin-owner"
                )
                self.title_filter = gr.Textbox(
                    label="Title", placeholder="any", scale=3, elem_id="admin-title"
                )
                self.refresh_button = gr.Button("Refresh", scale=1, elem_id="admin-refresh")
            self.sessions = gr.Dataframe(
                headers=SESSION_COLUMNS,
                interactive=False,
                elem_id="admin-sessions",
                label="Every session (select one for its detail)",
            )
            with gr.Column(visible=False, elem_id="admin-detail") as self.detail:
                self.session_detail()
            gr.Markdown("## Engine")
            self.engine = EnginePanelView(self.service, self.identity)

    def session_detail(self) -> None:
        self.detail_title = gr.HTML(elem_id="admin-detail-title")
        self.kv = gr.HTML(elem_id="admin-kv")
        with gr.Row():
            self.persist_button = gr.Button("Persist KV to disk", size="sm", elem_id="kv-persist")
            self.evict_button = gr.Button("Evict KV from the pool", size="sm", elem_id="kv-evict")
            self.drop_button = gr.Button("Drop KV", size="sm", variant="stop", elem_id="kv-drop")
        self.importance = gr.ScatterPlot(
            x="position",
            y="importance",
            color="slot",
            title="Token importance over positions",
            x_title="position in the conversation",
            y_title="attention received",
            color_map={"kept": "#0d9488", "evicted": "#cbd5e1"},
            height=260,
            elem_id="admin-importance",
        )
        self.evictions = gr.Dataframe(headers=EVICTION_COLUMNS, interactive=False, label="Eviction timeline")
        gr.Markdown("#### Retrieval events")
        self.retrievals = gr.HTML(elem_id="admin-retrievals")
        with gr.Accordion("Conversation", open=False):
            self.conversation = gr.HTML(elem_id="admin-conversation")

    def wire(self) -> None:
        listing = [self.sessions, self.session_ids]
        self.page.load(self.loaded, outputs=[self.denied, self.content, self.engine.timer, *listing])
        filters = [self.owner_filter, self.title_filter]
        gr.on(
            [self.refresh_button.click, self.owner_filter.submit, self.title_filter.submit],
            self.list_sessions,
            filters,
            listing,
            api_name="admin_sessions",
        )
        shown = [
            self.selected,
            self.detail,
            self.detail_title,
            self.kv,
            self.importance,
            self.evictions,
            self.retrievals,
            self.conversation,
        ]
        self.sessions.select(self.open_session, [self.session_ids], shown, api_visibility="private")
        for button, action in (
            (self.persist_button, "persist"),
            (self.evict_button, "evict"),
            (self.drop_button, "drop"),
        ):
            button.click(
                self.kv_action(action), [self.selected, *filters], shown + listing, api_name=f"kv_{action}"
            )

    # --- handlers ---

    @shows_errors
    async def loaded(self, request: gr.Request) -> tuple:
        user = await self.identity.user(request)
        if user.role != "admin":
            denied = gr.Markdown(
                "## Admins only\nThis page is for admins. [Back to the chat](/)", visible=True
            )
            return denied, gr.Column(visible=False), gr.Timer(active=False), [], []
        return (
            gr.Markdown(visible=False),
            gr.Column(visible=True),
            gr.Timer(active=True),
            *await self.rows(user),
        )

    async def rows(self, user, owner: str = "", title: str = "") -> tuple[list[list], list[str]]:
        found, _ = await self.service.admin.kv_sessions(
            user, owner=owner.strip() or None, title=title.strip() or None
        )
        return session_rows(found), [row.session_id for row in found]

    @shows_errors
    async def list_sessions(self, owner: str, title: str, request: gr.Request) -> tuple:
        return await self.rows(await self.identity.admin(request), owner or "", title or "")

    @shows_errors
    async def open_session(
        self, session_ids: list[str], selected: gr.SelectData, request: gr.Request
    ) -> tuple:
        user = await self.identity.admin(request)
        row = selected.index[0] if isinstance(selected.index, list | tuple) else selected.index
        if not 0 <= row < len(session_ids):
            raise gr.Error("That session is no longer listed; refresh the list.")
        return self.shown(await self.service.admin.session_kv(user, session_ids[row]))

    def shown(self, detail: SessionKvDetail) -> tuple:
        session = detail.session
        title = f"<h3>{html.text(session.title or '(untitled)')}</h3>" + html.muted(
            f"owner {detail.owner} · session {session.id} · started {session.created_at:%Y-%m-%d %H:%M}"
        )
        return (
            session.id,
            gr.Column(visible=True),
            title,
            kv_figures(detail.kv),
            importance_frame(detail.kv),
            eviction_rows(detail),
            retrieval_html(detail.messages),
            conversation_html(detail),
        )

    def kv_action(self, action: str):
        async def act(session_id: str | None, owner: str, title: str, request: gr.Request) -> tuple:
            user = await self.identity.admin(request)
            if session_id is None:
                raise gr.Error("Select a session first.")
            detail = await self.service.admin.kv_action(user, session_id, action)
            gr.Info(html.text(f"KV of '{detail.session.title}': {action} done."))  # a toast shows HTML
            return *self.shown(detail), *await self.rows(user, owner or "", title or "")

        act.__name__ = f"kv_{action}"
        return shows_errors(act)
