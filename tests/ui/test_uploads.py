"""The knowledge page's upload event reads only files its own login uploaded: through the event API a client
may name any path or URL, and none of those is read, copied into Gradio's cache or indexed."""

import stat
from pathlib import Path

import gradio_client
import httpx
import pytest
from gradio_client.client import Endpoint
from gradio_client.exceptions import AppError

from tests.ui.conftest import ADMIN_PASSWORD, ALICE

SERVER_FILE = Path(__file__).resolve().parents[2] / "README.md"  # on the server, readable by it


@pytest.fixture
def raw_payloads(monkeypatch):
    """Payloads sent as given: gradio_client would otherwise upload any local file a payload names."""
    monkeypatch.setattr(Endpoint, "process_input_files", lambda self, *data: data)


def file_data(path: str | Path) -> dict:
    return {"path": str(path), "orig_name": "notes.md", "meta": {"_type": "gradio.FileData"}}


def upload(client: gradio_client.Client, url: str, name: str, content: bytes) -> str:
    """Through Gradio's upload route, as the page does: the path the server stored the file at."""
    sent = httpx.post(f"{url}/gradio_api/upload", files=[("files", (name, content))], cookies=client.cookies)
    sent.raise_for_status()
    return sent.json()[0]


def documents(server, knowledge_base_id: str) -> list[str]:
    listed = server.rest(
        "GET", f"/api/knowledge-bases/{knowledge_base_id}/documents", key=server.user_keys["alice"]
    )
    return [document["name"] for document in listed.json()["data"]]


def test_no_server_path_or_url_is_read_and_nothing_is_copied(server, raw_payloads):
    client = gradio_client.Client(f"{server.url}/", auth=ALICE, verbose=False)
    knowledge_base = client.predict("Probe", api_name="/create_knowledge_base")[0]["value"]
    folder = server.data_dir / "uploads"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # Gradio's cache, private to the server
    before = sorted(folder.rglob("*"))
    for path in (SERVER_FILE, "http://198.51.100.7/notes.md", folder / ".." / "kvchat.db"):
        with pytest.raises(AppError, match="Only files uploaded from this page"):
            client.predict(knowledge_base, [file_data(path)], api_name="/upload_documents")
    assert sorted(folder.rglob("*")) == before
    assert documents(server, knowledge_base) == []


def test_an_upload_is_read_once_by_its_own_login_only_and_then_deleted(server, raw_payloads):
    alice = gradio_client.Client(f"{server.url}/", auth=ALICE, verbose=False)
    knowledge_base = alice.predict("Mine", api_name="/create_knowledge_base")[0]["value"]
    stored = upload(alice, server.url, "notes.md", b"# Notes\n\nThe library opens at nine.")

    admin = gradio_client.Client(f"{server.url}/", auth=("admin", ADMIN_PASSWORD), verbose=False)
    admin_base = admin.predict("Theirs", api_name="/create_knowledge_base")[0]["value"]
    with pytest.raises(AppError, match="not a file this login uploaded"):
        admin.predict(admin_base, [file_data(stored)], api_name="/upload_documents")

    report = alice.predict(knowledge_base, [file_data(stored)], api_name="/upload_documents")[1]
    assert "Added notes.md" in report
    assert documents(server, knowledge_base) == ["notes.md"]
    assert not Path(stored).exists()
    with pytest.raises(AppError, match="not a file this login uploaded"):
        alice.predict(knowledge_base, [file_data(stored)], api_name="/upload_documents")
