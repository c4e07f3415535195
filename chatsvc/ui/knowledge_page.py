"""The knowledge-base page: create and delete knowledge bases, upload documents (several at once, with
progress), list them with their paragraph counts, delete one, see and change the embedding model (with
progress), and try a query to see what a turn would get: the chosen intent, the window of passages and the
best paragraphs with their scores."""

import asyncio
from pathlib import Path

import gradio as gr

from chatsvc.ui import html
from chatsvc.ui.identity import shows_errors
from chatsvc.ui.page import Page
from chatsvc.ui.uploads import only_uploads
from chatsvc.views import EmbeddingModel, QueryPreview
from memory.retrieval import Document, Passage

DOCUMENT_COLUMNS = ["Document", "Kind", "Paragraphs", "Size", "Added"]
PROGRESS = gr.Progress()  # Gradio gives each call its own tracker in place of this marker
FILE_TYPES = [".txt", ".md", ".markdown", ".html", ".htm", ".pdf"]
EMBEDDING_INFO = "Chosen by the first document's language; changing it embeds every document again."


def document_rows(documents: list[Document]) -> list[list]:
    return [
        [d.name, d.kind, d.num_paragraphs, html.size(d.num_bytes), d.created_at.strftime("%Y-%m-%d %H:%M")]
        for d in documents
    ]


def passage_label(passage: Passage) -> str:
    numbers = ", ".join(str(position + 1) for position in passage.positions)
    return (
        f"{passage.document_name} › {passage.heading or 'top'} · paragraphs {numbers} · {passage.reason}"
        f" · score {passage.score:.3f} · {passage.num_tokens} tokens"
    )


def preview_html(preview: QueryPreview) -> str:
    """What a turn asking the query would get: intent and window, its passages, then the best paragraphs."""
    summary = html.stats(
        [
            ("intent", preview.intent),
            ("window, tokens", f"{preview.num_tokens} of {preview.budget_tokens}"),
            ("passages", len(preview.passages)),
            ("retrieval, ms", preview.latency_ms),
        ]
    )
    reason = html.muted(f"Intent chosen by: {preview.intent_reason}")
    passages = "".join(html.passage(passage_label(p), p.text) for p in preview.passages) or html.muted(
        "No passage was close enough to the query to enter the window."
    )
    hits = html.table(
        ["#", "score", "BM25", "similarity", "document", "paragraph", "text"],
        [
            [
                rank,
                f"{h.score:.3f}",
                f"{h.bm25:.2f}",
                f"{h.similarity:.3f}",
                h.document_name,
                h.position + 1,
                h.text[:240],
            ]
            for rank, h in enumerate(preview.hits, start=1)
        ],
        numeric=[0, 1, 2, 3, 5],
    )
    return f"{summary}{reason}<h4>Window</h4>{passages}<h4>Best paragraphs</h4>{hits}"


def model_dropdown(model: EmbeddingModel) -> gr.Dropdown:
    return gr.Dropdown(choices=model.choices, value=model.name)


class KnowledgePage(Page):
    def layout(self) -> None:
        self.document_ids = gr.State([])
        self.selected_document = gr.State(None)
        gr.Markdown("## Knowledge bases")
        self.knowledge_base_bar()
        self.confirm_row, self.confirm_delete = self.confirmation(
            "kb-confirm-delete", "Delete this knowledge base and all its documents?"
        )
        with gr.Row():
            self.document_area()
        gr.Markdown("### Try a query")
        with gr.Row(equal_height=True):
            self.query = gr.Textbox(
                show_label=False, placeholder="Ask what a chat would ask", scale=5, elem_id="kb-query"
            )
            self.query_button = gr.Button("Retrieve", variant="primary", scale=1, elem_id="kb-query-run")
        self.results = gr.HTML(elem_id="kb-results")

    def knowledge_base_bar(self) -> None:
        with gr.Row(elem_classes="kb-bar"):
            with gr.Column(scale=3):
                self.knowledge_base = gr.Dropdown([], label="Knowledge base", elem_id="kb-select")
                self.delete_base_button = gr.Button(
                    "Delete knowledge base", variant="stop", size="sm", elem_id="kb-delete"
                )
            with gr.Column(scale=3):
                self.new_name = gr.Textbox(label="New knowledge base", placeholder="Name", elem_id="kb-name")
                self.create_button = gr.Button("Create", size="sm", elem_id="kb-create")
            with gr.Column(scale=3):
                self.embedding_model = gr.Dropdown(
                    [], label="Embedding model", info=EMBEDDING_INFO, elem_id="kb-embedding-model"
                )
                self.embed_button = gr.Button("Use this model", size="sm", elem_id="kb-embed")

    def document_area(self) -> None:
        with gr.Column(scale=3):
            self.files = only_uploads(
                gr.File(
                    label="Add documents (.txt, .md, .html, .pdf)",
                    file_count="multiple",
                    file_types=FILE_TYPES,
                    elem_id="kb-files",
                )
            )
            self.upload_report = gr.HTML(elem_id="kb-upload-report")
        with gr.Column(scale=4):
            self.documents = gr.Dataframe(
                headers=DOCUMENT_COLUMNS,
                interactive=False,
                label="Documents (select one to delete it)",
                elem_id="kb-documents",
            )
            self.delete_document_button = gr.Button(
                "Delete selected document", size="sm", interactive=False, elem_id="kb-delete-document"
            )

    def wire(self) -> None:
        listing = [
            self.documents,
            self.document_ids,
            self.selected_document,
            self.delete_document_button,
            self.embedding_model,
        ]
        self.page.load(self.loaded, outputs=[self.knowledge_base, *listing])
        self.knowledge_base.change(
            self.show_documents, [self.knowledge_base], listing, api_name="list_documents"
        )
        self.embed_button.click(
            self.choose_embedding_model,
            [self.knowledge_base, self.embedding_model],
            [self.embedding_model],
            api_name="choose_embedding_model",
        )
        self.create_button.click(
            self.create,
            [self.new_name],
            [self.knowledge_base, self.new_name],
            api_name="create_knowledge_base",
        )
        self.ask_to_confirm(self.delete_base_button, self.confirm_row)
        self.confirm_delete.click(
            self.delete_base,
            [self.knowledge_base],
            [self.knowledge_base, self.confirm_row, *listing],
            api_name="delete_knowledge_base",
        )
        self.wire_documents(listing)
        gr.on(
            [self.query_button.click, self.query.submit],
            self.try_query,
            [self.knowledge_base, self.query],
            [self.results],
            api_name="try_query",
        )

    def wire_documents(self, listing: list) -> None:
        self.files.upload(
            self.upload,
            [self.knowledge_base, self.files],
            [self.files, self.upload_report, *listing],
            api_name="upload_documents",
        )
        self.documents.select(
            self.select_document, [self.document_ids], [self.selected_document, self.delete_document_button]
        )
        self.delete_document_button.click(
            self.delete_document,
            [self.knowledge_base, self.selected_document],
            listing,
            api_name="delete_document",
        )

    # --- handlers ---

    async def choices(self, request: gr.Request) -> list[tuple[str, str]]:
        bases = await self.service.knowledge.owned(await self.identity.user(request))
        return [(base.name, base.id) for base in bases]

    @shows_errors
    async def loaded(self, request: gr.Request) -> tuple:
        choices = await self.choices(request)
        first = choices[0][1] if choices else None
        return gr.Dropdown(choices=choices, value=first), *await self.listing(first, request)

    async def listing(self, knowledge_base_id: str | None, request: gr.Request) -> tuple:
        documents, model = [], gr.Dropdown(choices=[], value=None)
        if knowledge_base_id:
            user = await self.identity.user(request)
            documents = await self.service.knowledge.documents(user, knowledge_base_id)
            model = model_dropdown(await self.service.knowledge.embedding_model(user, knowledge_base_id))
        no_selection = gr.Button(interactive=False)
        return document_rows(documents), [d.id for d in documents], None, no_selection, model

    @shows_errors
    async def show_documents(self, knowledge_base_id: str | None, request: gr.Request) -> tuple:
        return await self.listing(knowledge_base_id, request)

    @shows_errors
    async def create(self, name: str, request: gr.Request) -> tuple:
        created = await self.service.knowledge.create(await self.identity.user(request), name or "")
        return gr.Dropdown(choices=await self.choices(request), value=created.id), ""

    @shows_errors
    async def delete_base(self, knowledge_base_id: str | None, request: gr.Request) -> tuple:
        if not knowledge_base_id:
            raise gr.Error("Choose a knowledge base first.")
        await self.service.knowledge.delete(await self.identity.user(request), knowledge_base_id)
        choices = await self.choices(request)
        first = choices[0][1] if choices else None
        return (
            gr.Dropdown(choices=choices, value=first),
            gr.Row(visible=False),
            *await self.listing(first, request),
        )

    @shows_errors
    async def upload(
        self,
        knowledge_base_id: str | None,
        paths: list[str] | None,
        request: gr.Request,
        progress=PROGRESS,
    ) -> tuple:
        """Indexes the files one by one, so the progress bar moves per file (embedding is the slow part)."""
        if not knowledge_base_id:
            raise gr.Error("Create or choose a knowledge base first.")
        user = await self.identity.user(request)
        added, rejected = [], []
        for done, path in enumerate(paths or []):
            name = Path(path).name
            progress((done, len(paths)), desc=f"Indexing {name}", unit="files")
            content = await asyncio.to_thread(self.identity.uploads.read, request.username, path)
            result = await self.service.knowledge.upload(user, knowledge_base_id, [(name, content)])
            added += result.added
            rejected += result.rejected
        report = "".join(html.muted(f"Added {d.name}: {d.num_paragraphs} paragraphs.") for d in added)
        report += "".join(html.unavailable(f"Not added: {r.reason}") for r in rejected)
        return None, report, *await self.listing(knowledge_base_id, request)

    def select_document(self, document_ids: list[int], selected: gr.SelectData) -> tuple:
        row = selected.index[0] if isinstance(selected.index, list | tuple) else selected.index
        if not 0 <= row < len(document_ids):
            return None, gr.Button(interactive=False)
        return document_ids[row], gr.Button(interactive=True)

    @shows_errors
    async def delete_document(
        self, knowledge_base_id: str | None, document_id: int | None, request: gr.Request
    ):
        if not knowledge_base_id or document_id is None:
            raise gr.Error("Select a document in the list first.")
        await self.service.knowledge.delete_document(
            await self.identity.user(request), knowledge_base_id, document_id
        )
        return await self.listing(knowledge_base_id, request)

    @shows_errors
    async def choose_embedding_model(
        self, knowledge_base_id: str | None, name: str | None, request: gr.Request, progress=PROGRESS
    ):
        if not knowledge_base_id or not isinstance(name, str):
            raise gr.Error("Choose a knowledge base and a model first.")

        def embedded(done: int, total: int) -> None:
            progress((done, total), desc="Embedding the documents again", unit="paragraphs")

        user = await self.identity.user(request)
        model = await self.service.knowledge.set_embedding_model(user, knowledge_base_id, name, embedded)
        gr.Info(f"The documents are embedded by {model.name}.")
        return model_dropdown(model)

    @shows_errors
    async def try_query(self, knowledge_base_id: str | None, query: str, request: gr.Request) -> str:
        if not knowledge_base_id:
            raise gr.Error("Create or choose a knowledge base first.")
        if not (query or "").strip():
            raise gr.Error("Write a query first.")
        preview = await self.service.knowledge.try_query(
            await self.identity.user(request), knowledge_base_id, query.strip()
        )
        return preview_html(preview)
