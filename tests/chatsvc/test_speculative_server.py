"""A server with --speculative ngram (the official openai client, a live server, the real SmolLM2): the reply
is the one a server without speculation gives, and the drafted and accepted tokens show on /metrics (vLLM's
names), on the admin engine panel and with the stored reply."""

import httpx
import openai

from tests.chatsvc.conftest import ADMIN_KEY, MODEL, LiveServer, server_settings

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
REPEAT = [
    {
        "role": "user",
        "content": "Repeat this text exactly: The order number is A-7731-Q and the product is the "
        "Nordic Steel Kettle, 1.7 litres. Returns are accepted within 30 days of delivery.",
    }
]


def metric(metrics: str, name: str) -> float:
    return float(
        next(line for line in metrics.splitlines() if line.startswith(f"kvchat:{name} ")).split()[-1]
    )


def test_a_server_with_speculation_replies_the_same_and_reports_its_drafts(tmp_path, smollm2_dir):
    replies = {}
    for speculative in None, "ngram":
        settings = server_settings(
            tmp_path / str(speculative), smollm2_dir, dtype="float32", speculative=speculative
        )
        with LiveServer(settings) as live:
            client = openai.OpenAI(base_url=f"{live.url}/v1", api_key=ADMIN_KEY, max_retries=0)
            completion = client.chat.completions.create(
                model=MODEL, messages=REPEAT, max_tokens=40, temperature=0
            )
            replies[speculative] = completion.choices[0].message.content
            live.wait_idle()
            metrics = httpx.get(f"{live.url}/metrics").text
            panel = httpx.get(f"{live.url}/api/admin/engine", headers=AUTH, timeout=30).json()
            stored = httpx.get(f"{live.url}/api/messages/{completion.message_id}", headers=AUTH).json()
    assert replies["ngram"] == replies[None] and "7731-Q" in replies[None]
    accepted = metric(metrics, "spec_decode_num_accepted_tokens_total")
    assert 0 < accepted <= metric(metrics, "spec_decode_num_draft_tokens_total")
    assert metric(metrics, "spec_decode_num_drafts_total") > 0
    assert 'speculative="ngram"' in next(
        line for line in metrics.splitlines() if line.startswith("kvchat:engine_info")
    )
    assert panel["speculative"].startswith("ngram: ") and "accepted" in panel["speculative"]
    assert 0 < stored["accepted_tokens"] <= stored["draft_tokens"]
