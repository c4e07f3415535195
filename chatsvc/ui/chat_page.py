"""The chat page: a sidebar of the user's sessions, the conversation with streamed replies, Stop, regenerate,
edit and resend, and the session's options.  Per-user state lives in gr.State; handlers call the service."""

import asyncio
from collections.abc import AsyncIterator, Awaitable

import gradio as gr

from chatsvc.chat_sessions import age_group
from chatsvc.models import User, utcnow
from chatsvc.service import ChatService
from chatsvc.turns import Turn, TurnOptions
from chatsvc.ui.chat_view import ChatView, conversation, streaming, written_text
from chatsvc.ui.identity import SHOWN_ERRORS, Identity, shows_errors
from chatsvc.ui.page import Page

DEFAULT_TEMPERATURE = 0.7
NO_KNOWLEDGE_BASE = ("No knowledge base", "")
ENGINE_NOTICES = {
    "loading": "The model is loading. You can write your message; sending works as soon as it is ready.",
    "failed": "The model could not be loaded; the server log says why. Chats cannot be answered.",
    "dead": "The engine stopped working; the server log says why. Chats cannot be answered.",
}


def sidebar_groups(sessions: list) -> list[dict]:
    """The sidebar's entries: pinned first, then by age, newest first (the service's order)."""
    now = utcnow()
    return [
        {
            "id": s.id,
            "title": s.title or "New chat",
            "group": "Pinned" if s.pinned else age_group(s.updated_at, now),
        }
        for s in sessions
    ]


def engine_notice(service: ChatService) -> str:
    notice = ENGINE_NOTICES.get(service.engines.state)
    return f'<div class="engine-notice" role="status">{notice}</div>' if notice else ""


class ChatPage(Page):
    @classmethod
    def blocks(cls, service: ChatService, identity: Identity, *, remote_images: bool) -> gr.Blocks:
        """`remote_images`: the admin lets Markdown images from other hosts load in messages and sources."""
        with gr.Blocks() as page:
            cls(service, identity, page, remote_images)
        return page

    def __init__(self, service: ChatService, identity: Identity, page: gr.Blocks, remote_images: bool):
        self.remote_images = remote_images
        super().__init__(service, identity, page)

    # --- layout ---

    def layout(self) -> None:
        self.session_id = gr.State(None)
        self.view = gr.State(ChatView())
        self.sessions = gr.State([])
        self.loading_timer = gr.Timer(2, active=False)
        with gr.Sidebar(elem_id="session-sidebar", width=300):
            self.sidebar()
        self.notice = gr.HTML(elem_id="engine-notice")
        self.conversation()
        with gr.Accordion("Session options", open=False, elem_id="session-options"):
            self.options()

    def sidebar(self) -> None:
        self.user_line = gr.Markdown(elem_classes="user-line")
        self.new_button = gr.Button("New chat", variant="primary", elem_id="new-chat")
        self.search = gr.Textbox(placeholder="Search chats", show_label=False, elem_id="session-search")
        self.session_list()
        with gr.Accordion("This chat", open=False, elem_id="chat-manage"):
            self.title = gr.Textbox(label="Title", elem_id="chat-title")
            self.rename_button = gr.Button("Rename", size="sm", elem_id="rename-chat")
            self.delete_button = gr.Button("Delete chat", size="sm", variant="stop", elem_id="delete-chat")
            self.confirm_row, self.confirm_delete = self.confirmation("confirm-delete")
        gr.Button("Log out", link="/logout", size="sm", elem_id="logout")

    def conversation(self) -> None:
        self.chatbot = gr.Chatbot(
            elem_id="chat",
            show_label=False,
            height="68vh",
            editable="user",
            allow_tags=False,
            buttons=["copy"],
            feedback_options=None,
            placeholder="Ask anything. Replies stream as they are written.",
        )
        with gr.Row(elem_id="composer"):
            self.message = gr.Textbox(
                placeholder="Message",
                show_label=False,
                lines=2,
                max_lines=10,
                scale=8,
                elem_id="message",
                submit_btn=False,
            )
            self.send_button = gr.Button("Send", variant="primary", scale=1, elem_id="send")
            self.stop_button = gr.Button("Stop", variant="stop", scale=1, visible=False, elem_id="stop")

    def options(self) -> None:
        self.system_prompt = gr.Textbox(
            label="System prompt",
            lines=2,
            elem_id="system-prompt",
            info="Fixed once the chat has messages: a change would invalidate the session's cached KV.",
        )
        with gr.Row():
            self.knowledge_base = gr.Dropdown(
                [NO_KNOWLEDGE_BASE], value="", label="Knowledge base", elem_id="knowledge-base"
            )
            self.temperature = gr.Slider(
                0, 2, value=DEFAULT_TEMPERATURE, step=0.05, label="Temperature", elem_id="temperature"
            )

    def session_list(self) -> None:
        @gr.render(inputs=[self.sessions, self.session_id])
        def entries(sessions: list[dict], current: str | None):
            if not sessions:
                gr.Markdown("No chats yet.", elem_classes="session-empty")
            group = None
            for entry in sessions:
                if entry["group"] != group:
                    group = entry["group"]
                    gr.Markdown(f"**{group}**", elem_classes="session-group")
                button = gr.Button(
                    entry["title"],
                    size="sm",
                    key=f"session-{entry['id']}",
                    variant="primary" if entry["id"] == current else "secondary",
                    elem_classes="session-entry",
                )
                # Keyed, the listener keeps its id when the list re-renders (after every switch, turn and
                # search), so a click on the button of the render before still opens this chat.
                button.click(
                    self.opener(entry["id"]),
                    outputs=self.opened_outputs(),
                    api_visibility="private",
                    key=f"open-{entry['id']}",
                )

    # --- wiring ---

    def wire(self) -> None:
        self.page.load(
            self.loaded,
            outputs=[self.notice, self.loading_timer, self.sessions, self.knowledge_base, self.user_line],
        )
        self.loading_timer.tick(
            self.engine_state, outputs=[self.notice, self.loading_timer], show_progress="hidden"
        )
        self.wire_turns()
        self.wire_sessions()
        self.knowledge_base.input(
            self.set_knowledge_base, [self.session_id, self.knowledge_base], api_name="set_knowledge_base"
        )
        self.temperature.release(
            self.set_temperature, [self.session_id, self.temperature], api_name="set_temperature"
        )

    def wire_turns(self) -> None:
        turn_inputs = [self.message, self.session_id, self.view, self.system_prompt]
        turn_inputs += [self.knowledge_base, self.temperature]
        gr.on(
            [self.send_button.click, self.message.submit],
            self.send,
            turn_inputs,
            self.turn_outputs(),
            api_name="send",
        )
        retry_inputs = [self.session_id, self.view, self.temperature]
        self.chatbot.retry(self.regenerate, retry_inputs, self.turn_outputs(), api_name="regenerate")
        self.chatbot.edit(self.edit, retry_inputs, self.turn_outputs(), api_name="edit")
        # Stop asks the service to stop the reply; the streaming event then ends by itself and shows the
        # stored reply.  (Cancelling the event as well would cancel the reply twice.)
        self.stop_button.click(self.stop, [self.session_id], [self.stop_button], api_name="stop")

    def wire_sessions(self) -> None:
        self.new_button.click(self.new_chat, outputs=self.opened_outputs(), api_name="new_chat")
        self.search.change(  # typing, pasting, and the clearing after a turn
            self.find, [self.search], [self.sessions], trigger_mode="always_last", api_name="search"
        )
        self.rename_button.click(
            self.rename, [self.session_id, self.title, self.search], [self.sessions], api_name="rename"
        )
        self.ask_to_confirm(self.delete_button, self.confirm_row)
        self.confirm_delete.click(
            self.delete, [self.session_id], [*self.opened_outputs(), self.sessions], api_name="delete"
        )

    def turn_outputs(self) -> list:
        return [
            self.chatbot,
            self.view,
            self.session_id,
            self.message,
            self.send_button,
            self.stop_button,
            self.sessions,
            self.system_prompt,
            self.title,
            self.search,
        ]

    def opened_outputs(self) -> list:
        return [
            self.session_id,
            self.view,
            self.chatbot,
            self.title,
            self.system_prompt,
            self.knowledge_base,
            self.temperature,
            self.confirm_row,
        ]

    # --- handlers ---

    @shows_errors
    async def loaded(self, request: gr.Request) -> tuple:
        user = await self.identity.user(request)
        sessions, _ = await self.service.chat_sessions.owned(user)
        bases = await self.service.knowledge.owned(user)
        choices = [NO_KNOWLEDGE_BASE] + [(base.name, base.id) for base in bases]
        role = " (admin)" if user.role == "admin" else ""
        notice, timer = self.engine_state()
        return (
            notice,
            timer,
            sidebar_groups(sessions),
            gr.Dropdown(choices=choices),
            f"Signed in as **{user.username}**{role}",
        )

    def engine_state(self) -> tuple[str, gr.Timer]:
        return engine_notice(self.service), gr.Timer(active=self.service.engines.state == "loading")

    def opener(self, session_id: str):
        async def open_this(request: gr.Request) -> tuple:
            return await self.open(session_id, request)

        return shows_errors(open_this)

    async def open(self, session_id: str, request: gr.Request) -> tuple:
        user = await self.identity.user(request)
        session, branch = await self.service.chat_sessions.get(user, session_id)
        view = conversation(branch, self.remote_images)
        temperature = DEFAULT_TEMPERATURE if session.temperature is None else session.temperature
        system_prompt = gr.Textbox(value=session.system_prompt or "", interactive=not branch)
        return (
            session.id,
            view,
            view.messages,
            session.title,
            system_prompt,
            session.knowledge_base_id or "",
            temperature,
            gr.Row(visible=False),
        )

    def new_chat(self) -> tuple:
        system_prompt = gr.Textbox(value="", interactive=True)
        return None, ChatView(), [], "", system_prompt, "", DEFAULT_TEMPERATURE, gr.Row(visible=False)

    @shows_errors
    async def find(self, query: str, request: gr.Request) -> list[dict]:
        sessions, _ = await self.service.chat_sessions.owned(
            await self.identity.user(request), search=query.strip() or None
        )
        return sidebar_groups(sessions)

    @shows_errors
    async def rename(self, session_id: str | None, title: str, query: str, request: gr.Request) -> list[dict]:
        if session_id is None:
            raise gr.Error("Open a chat to rename it.")
        user = await self.identity.user(request)
        await self.service.chat_sessions.rename(user, session_id, title.strip())
        sessions, _ = await self.service.chat_sessions.owned(user, search=query.strip() or None)
        return sidebar_groups(sessions)

    @shows_errors
    async def delete(self, session_id: str | None, request: gr.Request) -> tuple:
        user = await self.identity.user(request)
        if session_id is not None:
            await self.service.chat_sessions.delete(user, session_id)
        sessions, _ = await self.service.chat_sessions.owned(user)
        return *self.new_chat(), sidebar_groups(sessions)

    @shows_errors
    async def set_knowledge_base(self, session_id: str | None, knowledge_base_id: str, request: gr.Request):
        if session_id is not None:
            user = await self.identity.user(request)
            await self.service.chat_sessions.update(
                user, session_id, knowledge_base_id=knowledge_base_id or None
            )

    @shows_errors
    async def set_temperature(self, session_id: str | None, temperature: float, request: gr.Request):
        if session_id is not None:
            await self.service.chat_sessions.update(
                await self.identity.user(request), session_id, temperature=temperature
            )

    # --- turns ---

    @shows_errors
    async def send(
        self,
        message: str,
        session_id: str | None,
        view: ChatView,
        system_prompt: str,
        knowledge_base_id: str,
        temperature: float,
        request: gr.Request,
    ) -> AsyncIterator[dict]:
        if not (message or "").strip():
            raise gr.Error("The message is empty.")
        user = await self.identity.user(request)
        options = TurnOptions(temperature=temperature)
        if session_id is None:
            start = self.first_turn(user, message, options, system_prompt, knowledge_base_id)
        else:
            start = self.service.turns.send(user, session_id, message, options)
        async for update in self.run_turn(user, start, view.messages, message, draft=message):
            yield update

    async def first_turn(
        self, user: User, message: str, options: TurnOptions, system_prompt: str, knowledge_base_id: str
    ) -> Turn:
        """A new chat is stored with its options; if its first message cannot be sent, it is not kept."""
        session = await self.service.chat_sessions.create(
            user,
            system_prompt=(system_prompt or "").strip() or None,
            knowledge_base_id=knowledge_base_id or None,
            temperature=options.temperature,
        )
        try:
            return await self.service.turns.send(user, session.id, message, options)
        except BaseException:
            await asyncio.shield(self.service.chat_sessions.delete(user, session.id))
            raise

    @shows_errors
    async def regenerate(
        self,
        retry: gr.RetryData,
        session_id: str | None,
        view: ChatView,
        temperature: float,
        request: gr.Request,
    ) -> AsyncIterator[dict]:
        user = await self.identity.user(request)
        start = self.service.turns.regenerate(
            user, view.reply_after(retry.index), TurnOptions(temperature=temperature)
        )
        async for update in self.run_turn(user, start, view.messages[: retry.index + 1], None):
            yield update

    @shows_errors
    async def edit(
        self,
        edited: gr.EditData,
        session_id: str | None,
        view: ChatView,
        temperature: float,
        request: gr.Request,
    ) -> AsyncIterator[dict]:
        user = await self.identity.user(request)
        content = written_text(edited.value if isinstance(edited.value, str) else str(edited.value))
        options = TurnOptions(temperature=temperature)
        start = self.service.turns.edit(user, view.message_at(edited.index), content, options)
        async for update in self.run_turn(user, start, view.messages[: edited.index], content):
            yield update

    async def run_turn(
        self,
        user: User,
        start: Awaitable[Turn],
        before: list[dict],
        question: str | None,
        draft: str | None = None,
    ) -> AsyncIterator[dict]:
        """Show the question at once, stream the reply, then the stored turn with its sources and figures.
        Leaving early (Stop, a closed tab) cancels the reply: it is stored as aborted with its text so far."""
        yield {
            self.chatbot: streaming(before, question, "", self.remote_images),
            self.message: "",
            **self.generating(True),
        }
        try:
            turn = await start
        except SHOWN_ERRORS as error:  # a toast, and the page as it was (with the draft back in the box)
            gr.Warning(str(error))
            restored = {self.message: draft} if draft is not None else {}
            yield {self.chatbot: before, **restored, **self.generating(False)}
            return
        yield {self.session_id: turn.session_id}
        text = ""
        try:
            async for piece in turn.stream():
                text += piece
                yield {self.chatbot: streaming(before, question, text, self.remote_images)}
        finally:
            turn.cancel()
        result = await turn.result()
        yield await self.stored_turn(user, turn.session_id)
        if result.error is not None:
            gr.Warning(f"The reply failed: {result.error}")

    async def stored_turn(self, user: User, session_id: str) -> dict:
        session, branch = await self.service.chat_sessions.get(user, session_id)
        sessions, _ = await self.service.chat_sessions.owned(user)
        view = conversation(branch, self.remote_images)
        return {
            self.chatbot: view.messages,
            self.view: view,
            self.session_id: session.id,
            self.title: session.title,
            self.sessions: sidebar_groups(sessions),
            self.search: "",
            self.system_prompt: gr.Textbox(value=session.system_prompt or "", interactive=False),
            **self.generating(False),
        }

    def generating(self, running: bool) -> dict:
        return {
            self.send_button: gr.Button(visible=not running),
            self.stop_button: gr.Button(visible=running),
        }

    @shows_errors
    async def stop(self, session_id: str | None, request: gr.Request) -> gr.Button:
        """The reply stops and is stored as aborted with its text so far; the streaming event shows it."""
        stopped = session_id is not None and await self.service.turns.stop(
            await self.identity.user(request), session_id
        )
        return gr.Button(visible=False) if stopped else gr.skip()
