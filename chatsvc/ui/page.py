"""What every UI page shares: it lays out its components, then wires their events to the service."""

import gradio as gr

from chatsvc.service import ChatService
from chatsvc.ui.identity import Identity


class Page:
    @classmethod
    def blocks(cls, service: ChatService, identity: Identity) -> gr.Blocks:
        """The page as its own Blocks, to be rendered into the app's routes."""
        with gr.Blocks() as page:
            cls(service, identity, page)
        return page

    def __init__(self, service: ChatService, identity: Identity, page: gr.Blocks):
        self.service = service
        self.identity = identity
        self.page = page
        self.layout()
        self.wire()

    def layout(self) -> None:
        raise NotImplementedError

    def wire(self) -> None:
        raise NotImplementedError

    def confirmation(self, elem_id: str, question: str = "") -> tuple[gr.Row, gr.Button]:
        """A hidden row asking to confirm a deletion: its confirm button (the caller wires it) and a
        button that hides the row again."""
        with gr.Row(visible=False) as row:
            if question:
                gr.Markdown(question)
            confirm = gr.Button("Delete for good", variant="stop", size="sm", elem_id=elem_id)
            gr.Button("Keep it", size="sm").click(
                lambda: gr.Row(visible=False), outputs=[row], api_visibility="private"
            )
        return row, confirm

    def ask_to_confirm(self, button: gr.Button, row: gr.Row) -> None:
        button.click(lambda: gr.Row(visible=True), outputs=[row], api_visibility="private")
