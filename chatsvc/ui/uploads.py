"""Files reach a UI event only as uploads of the caller's own login.  The event API is open to any logged-in
user with any payload, and a file input's payload is a path: Gradio, mounted into our app, would copy any
server path (or download any URL) named there into its cache.  So the knowledge page's file input refuses
every path outside Gradio's upload folder before anything is copied, and the upload event reads a file only
if the ledger says this login uploaded it."""

import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import gradio as gr
from fastapi import Request
from gradio.utils import is_in_or_equal
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UPLOAD_PATH = "/gradio_api/upload"  # Gradio's upload route, where the UI is mounted at /
UNCLAIMED_S = 3600  # an upload no event has read is deleted after this long
SWEEP_EVERY_S = 600


class UploadLedger:
    """Which login uploaded which file into the upload folder, which only this ledger empties."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.uploads: dict[tuple[str, str], float] = {}  # (login id, path) -> when
        self.swept_at = -SWEEP_EVERY_S
        self._sweep(max_age_s=0)  # nothing from before a restart can be claimed

    def record(self, login_id: str, paths: list[str]) -> None:
        now = time.monotonic()
        self.uploads.update({(login_id, path): now for path in paths})
        if now - self.swept_at > SWEEP_EVERY_S:
            self.uploads = {key: at for key, at in self.uploads.items() if now - at < UNCLAIMED_S}
            self._sweep(UNCLAIMED_S)

    def read(self, login_id: str, path: str) -> bytes:
        """The file's content, once; the file is deleted unless another login uploaded the same one."""
        if self.uploads.pop((login_id, path), None) is None:
            raise PermissionError(f"{Path(path).name}: not a file this login uploaded; upload it again")
        content = Path(path).read_bytes()
        if not any(held == path for _, held in self.uploads):
            _delete(Path(path))
        return content

    def _sweep(self, max_age_s: float) -> None:
        """Deletes files older than max_age_s, and Gradio's leftovers with them (empty parts of uploads)."""
        self.swept_at = time.monotonic()
        oldest = time.time() - max_age_s
        for path in list(self.folder.rglob("*")):
            if path.is_file() and path.stat().st_mtime <= oldest:
                _delete(path)


def _delete(path: Path) -> None:
    """The file, and its folder if that is left empty (Gradio puts each upload in a folder of its own)."""
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()


class RecordUploads:
    """Notes in the ledger the files each login uploads through Gradio's upload route, before the client
    learns their paths."""

    def __init__(
        self, app: ASGIApp, ledger: UploadLedger, login_id: Callable[[Request], Awaitable[str | None]]
    ):
        self.app = app
        self.ledger = ledger
        self.login_id = login_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != UPLOAD_PATH:
            return await self.app(scope, receive, send)
        login_id = await self.login_id(Request(scope))
        if login_id is None:  # Gradio refuses it
            return await self.app(scope, receive, send)
        held: list[Message] = []

        async def hold_until_recorded(message: Message) -> None:
            held.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                if held[0]["status"] == 200:
                    body = b"".join(m.get("body", b"") for m in held[1:])
                    self.ledger.record(login_id, json.loads(body))
                for each in held:
                    await send(each)

        await self.app(scope, receive, hold_until_recorded)


def only_uploads(files: gr.File) -> gr.File:
    """The file input takes only files in Gradio's upload folder: no other server path, no URL.  Set on the
    instance: subclassing a Gradio component makes Gradio write a .pyi stub beside the subclass's module."""
    move_to_cache = files.async_move_resource_to_block_cache

    async def move_uploaded(url_or_file_path: str | Path | None) -> str | None:
        if url_or_file_path is not None and not is_in_or_equal(str(url_or_file_path), files.GRADIO_CACHE):
            raise gr.Error("Only files uploaded from this page can be added.")
        return await move_to_cache(url_or_file_path)

    files.async_move_resource_to_block_cache = move_uploaded
    return files
