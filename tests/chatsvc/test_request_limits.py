"""Limits on what a request may carry: every integer is bounded (2**70 is a clear 4xx, never a 500), `model`
must name the served model, `stop` holds a few short strings.  The integers are found in the app's OpenAPI
schema, so a route or field added later without bounds fails here."""

import pytest

from tests.chatsvc.conftest import MODEL

HUGE = 2**70
QUESTION = [{"role": "user", "content": "Limits check: say hi."}]


def is_integer(schema: dict) -> bool:
    """An integer, or an optional one (anyOf integer and null)."""
    return schema.get("type") == "integer" or any(is_integer(option) for option in schema.get("anyOf", []))


def operations(server) -> list[tuple[str, str, dict]]:
    paths = server.app.openapi()["paths"]
    return [(method.upper(), path, op) for path, ops in paths.items() for method, op in ops.items()]


def integer_parameters(server) -> list[tuple[str, str, str, dict]]:
    """(method, path, name, schema) of every integer path or query parameter."""
    return [
        (method, path, parameter["name"], parameter["schema"])
        for method, path, op in operations(server)
        for parameter in op.get("parameters", [])
        if is_integer(parameter["schema"])
    ]


def integer_body_fields(server) -> list[tuple[str, str, str]]:
    """(method, path, field) of every integer field of a JSON request body."""
    components = server.app.openapi()["components"]["schemas"]
    found = []
    for method, path, op in operations(server):
        body = op.get("requestBody", {}).get("content", {}).get("application/json")
        if body:
            model = components[body["schema"]["$ref"].rsplit("/", 1)[-1]]
            found += [
                (method, path, name) for name, field in model["properties"].items() if is_integer(field)
            ]
    return found


def concrete(path: str, **values) -> str:
    """The path with its parameters filled in: `values` where given, else 1 (an id, or a name)."""
    for part in path.split("/"):
        if part.startswith("{"):
            path = path.replace(part, str(values.get(part[1:-1], 1)))
    return path


def send_parameter(server, method: str, path: str, name: str, value: int):
    if f"{{{name}}}" in path:
        return server.rest(method, concrete(path, **{name: value}))
    return server.rest(method, concrete(path), params={name: value})


def test_the_walk_finds_the_integers_of_paths_queries_and_bodies(server):
    names = {name for _, _, name, _ in integer_parameters(server)}
    names |= {name for _, _, name in integer_body_fields(server)}
    expected = {"message_id", "key_id", "user_id", "document_id", "limit", "offset"}
    expected |= {"kv_budget_tokens", "max_tokens", "max_completion_tokens", "seed", "k"}
    assert expected <= names


def test_every_integer_path_and_query_parameter_refuses_2_to_the_70(server):
    for method, path, name, _ in integer_parameters(server):
        response = send_parameter(server, method, path, name, HUGE)
        assert 400 <= response.status_code < 500, f"{method} {path} {name}: {response.text}"
        assert f".{name}: " in response.json()["error"]["message"]  # refused for this parameter


def test_the_largest_value_each_parameter_allows_is_no_error_of_the_server(server):
    for method, path, name, schema in integer_parameters(server):
        response = send_parameter(server, method, path, name, schema["maximum"])
        assert response.status_code < 500, f"{method} {path} {name}: {response.text}"


@pytest.mark.parametrize("sign", [1, -1])
def test_every_integer_body_field_refuses_2_to_the_70(server, sign):
    # A real session: the session routes look it up before they read the body.
    session_id = server.rest("POST", "/api/sessions", json={"title": "limits check"}).json()["id"]
    for method, path, name in integer_body_fields(server):
        response = server.rest(method, concrete(path, session_id=session_id), json={name: sign * HUGE})
        assert 400 <= response.status_code < 500, f"{method} {path} {name}: {response.text}"
        assert f"body.{name}: " in response.json()["error"]["message"]  # refused for this field
    server.rest("DELETE", f"/api/sessions/{session_id}")


def test_the_largest_and_smallest_seeds_are_accepted_by_the_engine(server, client):
    for seed in (2**63 - 1, -(2**63)):
        completion = client.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=2, temperature=1.0, seed=seed
        )
        assert completion.choices[0].finish_reason in ("length", "stop")


def test_a_model_the_server_does_not_serve_gets_404_like_vllm(server):
    response = server.rest("POST", "/v1/chat/completions", json={"model": "gpt-4o", "messages": QUESTION})
    assert response.status_code == 404
    assert response.json()["error"] == {
        "message": "The model `gpt-4o` does not exist.",
        "type": "not_found_error",
        "code": 404,
    }


def test_no_model_or_the_served_one_is_answered(server, client):
    for body in ({}, {"model": ""}, {"model": MODEL}):
        server.wait_idle()
        response = server.rest(
            "POST", "/v1/chat/completions", json={**body, "messages": QUESTION, "max_tokens": 2}
        )
        assert response.status_code == 200, response.text
        assert response.json()["model"] == MODEL


@pytest.mark.parametrize(
    ("stop", "phrase"),
    [
        (["x"] * 17, "at most 16 items"),
        (["x" * 257], "at most 256 characters"),
        ("x" * 257, "at most 256 characters"),
    ],
)
def test_stop_holds_at_most_16_strings_of_256_characters(server, stop, phrase):
    response = server.rest("POST", "/v1/chat/completions", json={"messages": QUESTION, "stop": stop})
    assert response.status_code == 422
    assert phrase in response.json()["error"]["message"]


def test_16_stop_strings_of_256_characters_are_accepted(server, client):
    stop = [f"{i:02d}" * 128 for i in range(16)]
    completion = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, stop=stop)
    assert completion.choices[0].finish_reason in ("length", "stop")
