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
