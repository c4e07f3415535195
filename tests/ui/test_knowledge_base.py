"""The knowledge-base page in Chromium: several files uploaded at once (a broken one rejected with its
reason), the documents with their paragraph counts, a query preview, an answer citing the document, and
document text that never runs as HTML."""

from pathlib import Path

from playwright.sync_api import expect

from tests.ui.conftest import (
    ALICE,
    chat_ready,
    log_in,
    screenshot,
    send,
    set_temperature,
    wait_reply,
)

DATA = Path(__file__).with_name("data")


def table_rows(dataframe) -> list[list[str]]:
    """The visible rows of a gr.Dataframe (it also keeps a hidden table for sizing)."""
    rows = dataframe.locator("[role=row].virtual-row").all()
    return [[cell.inner_text() for cell in row.locator("[role=gridcell]").all()] for row in rows]


def upload_and_try_a_query(page) -> None:
    page.locator("#kb-name textarea, #kb-name input").first.fill("Station handbook")
    page.locator("#kb-create").click()
    expect(page.locator("#kb-select input")).to_have_value("Station handbook")
    page.locator("#kb-files input[type=file]").set_input_files(
        [DATA / "station_handbook.md", DATA / "kitchen_notes.txt", DATA / "broken.pdf"]
    )
    page.locator("#kb-upload-report").get_by_text("Not added: broken.pdf").wait_for(timeout=120_000)
    documents = page.locator("#kb-documents")
    expect(documents).to_contain_text("station_handbook.md")
    rows = {row[0]: row for row in table_rows(documents)}
    assert set(rows) == {"station_handbook.md", "kitchen_notes.txt"}  # the broken file is not listed
    assert rows["station_handbook.md"][2] == "2"  # paragraphs

    page.locator("#kb-query textarea, #kb-query input").first.fill("When can visitors see the greenhouse?")
    page.locator("#kb-query-run").click()
    results = page.locator("#kb-results")
    results.get_by_text("Best paragraphs").wait_for()
    assert "knowledge" in results.inner_text()  # the chosen intent
    assert "every Tuesday from 9 to 11" in results.locator(".kv-passage").first.inner_text()


def embed_with_e5(server, page) -> None:
    """The English documents got MiniLM; choosing e5 embeds them again and says so."""
    model = page.locator("#kb-embedding-model input")
    expect(model).to_have_value("minilm")
    model.click()
    page.get_by_role("option", name="multilingual-e5-small").click()
    page.locator("#kb-embed").click()
    page.get_by_text("The documents are embedded by multilingual-e5-small.").wait_for(timeout=60_000)
    bases = server.rest("GET", "/api/knowledge-bases", key=server.user_keys["alice"]).json()["data"]
    kb = next(base["id"] for base in bases if base["name"] == "Station handbook")
    path = f"/api/knowledge-bases/{kb}/embedding-model"
    assert server.rest("GET", path, key=server.user_keys["alice"]).json()["name"] == "multilingual-e5-small"


def test_upload_query_and_an_answer_that_cites_the_document(server, page):
    log_in(page, server.url, *ALICE, path="/knowledge")
    upload_and_try_a_query(page)
    embed_with_e5(server, page)
    screenshot(page, "knowledge-base")
    assert page.evaluate("window.__xss") is None

    page.goto(server.url + "/")
    chat_ready(page)
    set_temperature(page, 0)
    page.locator("#knowledge-base input").click()
    page.get_by_role("option", name="Station handbook").click()
    send(page, "When does the Zorblax station open its greenhouse to visitors?")
    wait_reply(page)
    reply = page.locator("#chat .bot").last
    reply.get_by_text("Sources (").click()
    paragraph = reply.get_by_text("every Tuesday from 9 to 11 in the morning").filter(visible=True)
    shown_before = paragraph.count()  # the reply may quote it too
    reply.get_by_text("[1] station_handbook.md").click()
    expect(paragraph).to_have_count(shown_before + 1)
    screenshot(page, "chat-citation")
    sessions = server.rest(
        "GET", "/api/sessions", key=server.user_keys["alice"], params={"q": "Zorblax"}
    ).json()
    stored = server.rest("GET", f"/api/sessions/{sessions['data'][0]['id']}", key=server.user_keys["alice"])
    citations = stored.json()["messages"][-1]["citations"]
    assert citations[0]["title"] == "station_handbook.md"
    assert page.evaluate("window.__xss") is None and not page.script_errors


def test_delete_a_document(server, page):
    log_in(page, server.url, *ALICE, path="/knowledge")
    page.locator("#kb-name textarea, #kb-name input").first.fill("Scratch")
    page.locator("#kb-create").click()
    expect(page.locator("#kb-select input")).to_have_value("Scratch")
    page.locator("#kb-files input[type=file]").set_input_files([DATA / "kitchen_notes.txt"])
    documents = page.locator("#kb-documents")
    page.locator("#kb-upload-report").get_by_text("Added kitchen_notes.txt").wait_for(timeout=120_000)
    documents.get_by_text("kitchen_notes.txt").locator("visible=true").first.click()
    page.locator("#kb-delete-document").click()
    page.wait_for_function(
        "() => !document.querySelector('#kb-documents').innerText.includes('kitchen_notes')"
    )
    assert page.evaluate("window.__xss") is None
