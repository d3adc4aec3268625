"""The OpenAPI document states the rules the server applies between fields and inside
free-form objects, exactly: a body valid by the published schema is not refused for them,
and one it rejects is refused (what the fuzz run's ``positive_data_acceptance`` and
``negative_data_rejection`` check from the outside). Each test compares the published
JSON Schema with the server's own validation over the same inputs."""
from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator

from app.errors import InvalidRequest
from app.services.chat.completions import _validate
from app.services.chat.messages import to_openai


@pytest.fixture(scope="module")
def components(app):
    with app.test_client() as c:
        return c.get("/openapi.json").get_json()["components"]["schemas"]


def _valid(schema: dict, value) -> bool:
    return Draft202012Validator(schema).is_valid(value)


TOOL = {"type": "function", "function": {"name": "f", "parameters": {}}}
MESSAGES = [
    {"role": "user", "content": "hi"},
    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    {"role": "system", "content": "be brief"},
    {"role": "developer", "content": "x"},
    {"role": "assistant"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {}}]},
    {"role": "assistant", "content": "", "tool_calls": None},
    {"role": "tool", "tool_call_id": "c", "content": "42"},
    {"role": "tool", "tool_call_id": 7},
    {"role": "tool", "tool_call_id": "c", "content": "down", "is_error": True},
    {"role": "tool", "tool_call_id": "c", "is_error": None},
    {"role": "function", "name": "f", "content": "x"},
    {"role": "assistant", "content": "a", "thinking_blocks": [{"type": "thinking", "thinking": "x", "signature": "s"}]},
    {"role": "assistant", "content": "a", "thinking_blocks": None},
    # refused
    {"role": "assistant", "content": "a", "thinking_blocks": "x"}, {"role": "assistant", "thinking_blocks": [1]},
    {}, {"content": "hi"}, {"role": "robot", "content": "hi"}, {"role": None}, {"role": 1},
    {"role": "user"}, {"role": "user", "content": ""}, {"role": "user", "content": []},
    {"role": "user", "content": None}, {"role": "system", "content": 5},
    {"role": "assistant", "content": {"text": "x"}},
    {"role": "assistant", "tool_calls": {}}, {"role": "assistant", "tool_calls": [1]},
    {"role": "assistant", "tool_calls": [{"function": "f"}]}, {"role": "assistant", "tool_calls": [{}]},
    {"role": "tool", "content": "42"}, {"role": "tool", "tool_call_id": ""},
    {"role": "tool", "tool_call_id": 0}, {"role": "tool", "tool_call_id": None},
    {"role": "tool", "tool_call_id": []}, {"role": "tool", "tool_call_id": {}},
    {"role": "tool", "tool_call_id": False},
    {"role": "tool", "tool_call_id": "c", "is_error": "true"}, {"role": "tool", "tool_call_id": "c", "is_error": 1},
]
TOOLS = [
    TOOL, {"function": {"name": "f"}}, {"type": "function", "function": {"name": 1}},
    # refused
    {}, {"function": None}, {"function": "f"}, {"function": {}}, {"function": {"name": ""}},
    {"function": {"name": None}}, {"function": {"name": 0}},
]


def _accepted(check, body: dict) -> bool:
    """Whether the server's own check (``_validate``, ``to_openai``) takes ``body``."""
    try:
        check(body)
        return True
    except InvalidRequest:
        return False


def _server_accepts(body: dict) -> bool:
    return _accepted(_validate, body)


@pytest.mark.parametrize("message", MESSAGES)
def test_a_chat_message_is_refused_exactly_when_the_schema_rejects_it(components, message):
    schema = components["ChatRequest"]
    body = {"model": "auto", "messages": [message]}
    assert _valid(schema, body) == _server_accepts(body)


@pytest.mark.parametrize("tool", TOOLS)
def test_a_chat_tool_is_refused_exactly_when_the_schema_rejects_it(components, tool):
    schema = components["ChatRequest"]
    body = {"model": "auto", "messages": [MESSAGES[0]], "tools": [tool]}
    assert _valid(schema, body) == _server_accepts(body)


def test_both_lists_hold_accepted_and_refused_cases(components):
    accepted = [m for m in MESSAGES if _server_accepts({"model": "a", "messages": [m]})]
    assert 0 < len(accepted) < len(MESSAGES)


# /v1/messages (Anthropic's Messages API): the same comparison for a message and ``system``.
_USE = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
_IMG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
ANTHROPIC_MESSAGES = [
    {"role": "user", "content": "hi"}, {"role": "assistant", "content": ""},
    {"role": "user", "content": [{"type": "text", "text": ""}]},
    {"role": "assistant", "content": [{"type": "text", "text": ""}]},
    {"role": "user", "content": [_IMG, {"type": "text", "text": "what?"}]},
    {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]},
    {"role": "assistant", "content": [{"type": "text", "text": "a"}, _USE]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "42"}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                  "content": [{"type": "text", "text": "42"}]}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "down", "is_error": True}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": None}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [_IMG]}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                  "content": [{"type": "text", "text": "x"}, _IMG]}]},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "s"}, _USE]},
    {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "d"}, {"type": "text", "text": "a"}]},
    {"role": "user", "content": [{"type": "document", "title": "t", "context": None,
                                  "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]},
    {"role": "user", "content": [{"type": "document",
                                  "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}]},
    # refused
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "document", "source": {"type": "url", "url": "https://x/y.pdf"}}]}]},
    {"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": "s"}]},
    {"role": "assistant", "content": [{"type": "redacted_thinking"}]},
    {"role": "assistant", "content": [{"type": "document", "source": {
        "type": "text", "media_type": "text/plain", "data": "x"}}]},
    {"role": "user", "content": [{"type": "document", "source": {"type": "text", "media_type": "text/html",
                                                                 "data": "x"}}]},
    {"role": "user", "content": [{"type": "document", "source": {"type": "url", "url": "https://x/y.pdf"}}]},
    {"role": "user", "content": [{"type": "document", "source": {"type": "base64", "media_type": "image/png",
                                                                 "data": "AAAA"}}]},
    {"role": "user", "content": [{"type": "document", "title": 5, "source": {
        "type": "text", "media_type": "text/plain", "data": "x"}}]},
    {"role": "user", "content": ""}, {"role": "user", "content": []}, {"role": "assistant", "content": []},
    {"role": "system", "content": "x"}, {"role": "user"}, {"role": "user", "content": 5},
    {"role": "user", "content": [{"type": "text"}]}, {"role": "user", "content": [{"type": "text", "text": 5}]},
    {"role": "user", "content": [{"type": "document", "source": {}}]},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]},
    {"role": "assistant", "content": [_IMG]}, {"role": "user", "content": [_USE]},
    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
    {"role": "user", "content": [{"type": "image"}]},
    {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png"}}]},
    {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": ""}}]},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "", "name": "f"}]},
    {"role": "user", "content": [{"type": "tool_result"}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [_IMG, 1]}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [_IMG, {"type": "image"}]}]},
    {"role": "user", "content": [1]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]},
]
SYSTEMS = ["be brief", "", None, [], [{"type": "text", "text": "be brief"}],
           # refused
           5, [{"type": "image"}], [{"type": "text"}], [{"type": "text", "text": 5}], ["x"]]


def _messages_server_accepts(body: dict) -> bool:
    return _accepted(to_openai, body)


def _counted_by_server(body: dict) -> bool:
    """What ``messages.count_tokens`` translates (its body without ``max_tokens``)."""
    return _accepted(lambda b: to_openai({**b, "max_tokens": None}), body)


@pytest.mark.parametrize("message", ANTHROPIC_MESSAGES)
def test_a_messages_api_message_is_refused_exactly_when_the_schema_rejects_it(components, message):
    """A schema-valid ``/v1/messages`` request was refused with 400 for an empty user turn,
    a text block without text, an image without a source, a block type or turn the
    translation does not take …: the document now states what the server applies."""
    body = {"model": "auto", "max_tokens": 10, "messages": [message]}
    assert _valid(components["MessagesRequest"], body) == _messages_server_accepts(body)
    # count_tokens takes the same request without max_tokens, translated the same way
    del body["max_tokens"]
    assert _valid(components["CountTokensRequest"], body) == _counted_by_server(body)


@pytest.mark.parametrize("system", SYSTEMS)
def test_a_messages_api_system_prompt_is_refused_exactly_when_the_schema_rejects_it(components, system):
    body = {"model": "auto", "max_tokens": 10, "messages": [ANTHROPIC_MESSAGES[0]], "system": system}
    assert _valid(components["MessagesRequest"], body) == _messages_server_accepts(body)
    del body["max_tokens"]
    assert _valid(components["CountTokensRequest"], body) == _counted_by_server(body)


THINKINGS = [{"type": "enabled", "budget_tokens": 1024}, {"type": "enabled", "budget_tokens": 5000.0},
             {"type": "disabled"}, {"type": "disabled", "budget_tokens": 3}, None,
             {"type": "enabled", "budget_tokens": 1023}, {"type": "enabled"}, {"type": "enabled", "budget_tokens": "2k"},
             {"type": "enabled", "budget_tokens": True}, {"type": "adaptive"}, {}, {"budget_tokens": 2048}]


@pytest.mark.parametrize("thinking", THINKINGS)
def test_a_messages_api_thinking_is_refused_exactly_when_the_schema_rejects_it(components, thinking):
    """``thinking`` was taken and ignored; now that it is sent on, its shape is the document's
    (its budget below ``max_tokens`` is Anthropic's rule between two fields, also a 400 there)."""
    body = {"model": "auto", "max_tokens": 999_999, "messages": [ANTHROPIC_MESSAGES[0]], "thinking": thinking}
    assert _valid(components["MessagesRequest"], body) == _messages_server_accepts(body)


def test_both_messages_api_lists_hold_accepted_and_refused_cases():
    ok = [m for m in ANTHROPIC_MESSAGES
          if _messages_server_accepts({"model": "a", "max_tokens": 1, "messages": [m]})]
    assert 0 < len(ok) < len(ANTHROPIC_MESSAGES)


PATCHES = [
    ({"spend_limit_cents": 500}, True), ({"spend_limit_cents": 500, "spend_limit_period": "day"}, True),
    ({"spend_limit_cents": None}, True), ({"spend_limit_period": "week"}, True),
    ({"spend_limit_cents": 500, "spend_limit_period": None}, True),
    ({}, False), ({"spend_limit_period": None}, False),
    ({"spend_limit_cents": None, "spend_limit_period": "day"}, False),
]


@pytest.mark.parametrize("body,accepted", PATCHES)
def test_a_key_patch_is_refused_exactly_when_the_schema_rejects_it(client, account, components, body, accepted):
    """The key has a limit, so a period alone is a change the server takes."""
    auth = {"Authorization": f"Bearer {account.key}"}
    made = client.post("/api/keys", json={"name": "k", "scopes": ["call:write"], "spend_limit_cents": 100},
                       headers=auth)
    assert made.status_code == 201
    assert _valid(components["KeyUpdate"], body) is accepted
    r = client.patch(f"/api/keys/{made.get_json()['id']}", json=body, headers=auth)
    assert r.status_code == (200 if accepted else 400), r.get_json()


@pytest.mark.parametrize("body,accepted", [
    ({"name": "k"}, True), ({"name": "k", "spend_limit_cents": 5}, True),
    ({"name": "k", "spend_limit_cents": 5, "spend_limit_period": "day"}, True),
    ({"name": "k", "spend_limit_period": "day"}, False)])
def test_a_key_period_without_a_limit_is_refused_as_the_schema_says(client, account, components, body, accepted):
    assert _valid(components["KeyCreate"], body) is accepted
    r = client.post("/api/keys", json=body, headers={"Authorization": f"Bearer {account.key}"})
    assert r.status_code == (201 if accepted else 400), r.get_json()


@pytest.mark.parametrize("url,accepted", [
    (None, True), ("https://hooks.example.com/in", True), ("https://hooks.example.com/a\u0085b", False),
    ("https://hooks.example.com/a\u009fb", False), ("https://hooks.example.com/\u00e9", True)])
def test_a_patterned_field_publishes_the_control_character_rule_too(app, components, url, accepted):
    """A field with its own pattern also refuses C1 control characters (the input policy);
    the document says so beside the pattern, and keeps ``null`` valid where it is allowed."""
    from app.blueprints.agents.schemas import RegisterSchema

    published = components["Register"]["properties"]["webhook"]
    assert _valid(published, url) is accepted
    errors = RegisterSchema().validate({"name": "a", "pubkey": "ed25519:" + "1" * 44, "webhook": url})
    assert ("webhook" not in errors) is accepted


def test_the_processor_webhook_documents_its_signature_header(client):
    op = client.get("/openapi.json").get_json()["paths"]["/api/pay/webhook"]["post"]
    header = [p for p in op["parameters"] if p["in"] == "header"]
    assert header == [{**header[0], "name": "Stripe-Signature", "required": True}]
    assert op["requestBody"]["required"] is True


def test_the_fuzz_runs_allowances_name_operations_of_the_document(client):
    """``SEMANTIC_422`` / ``SEMANTIC_400`` / ``PAYMENT_402`` / ``AGENT_ONLY`` are matched by
    operation name: a renamed route must not leave an allowance that matches nothing (nor a
    check that never ran, nor an agent-only operation called with a key again)."""
    from tests.fuzz.run_fuzz import AGENT_ONLY, PAYMENT_402, SEMANTIC_400, SEMANTIC_422, UPSTREAM_502, \
        _operations_config

    paths = client.get("/openapi.json").get_json()["paths"]
    names = {f"{method.upper()} {path}" for path, ops in paths.items() for method in ops
             if method in ("get", "post", "put", "patch", "delete")}
    listed = set(SEMANTIC_422) | set(SEMANTIC_400) | set(PAYMENT_402) | set(AGENT_ONLY) | set(UPSTREAM_502)
    assert listed <= names
    config = _operations_config("svc_sess_x")
    assert config.count("[[operations]]") == len(listed)
    assert '"400"' in config and '"402"' in config and '"422"' in config
    assert config.count('headers = { Authorization = "Bearer svc_sess_x" }') == len(AGENT_ONLY)


# The operations issue 42 item 12 found refusing schema-valid requests with 400.
ISSUE_42_NINE = ("GET /api/usage/export", "GET /api/wallet/connect/message", "POST /api/wallet/connect",
                 "POST /api/keys", "POST /api/pay/method", "POST /api/pay/webhook", "POST /api/wallet/fund",
                 "POST /v1/module/{slug}/call")


def test_the_fuzz_run_accepts_no_400_on_issue_42s_operations_and_each_422_is_documented(client):
    """A schema-valid request to these is never a 400 any more: the fuzz run no longer accepts
    one there, nor on any operation but the MCP, OpenAI and Anthropic surfaces (their
    clients' convention, documented), and every operation allowed a 422 documents it."""
    import tomllib

    from tests.fuzz.run_fuzz import SEMANTIC_400, SEMANTIC_422, _operations_config

    assert not set(ISSUE_42_NINE) & set(SEMANTIC_400)
    # only the conventions of surfaces whose clients read the status keep a 400
    assert set(SEMANTIC_400) == {"POST /mcp", "POST /v1/chat/completions", "POST /v1/messages",
                                 "POST /v1/messages/count_tokens"}
    for name in SEMANTIC_400:
        method, path = name.split(" ", 1)
        assert "400" in client.get("/openapi.json").get_json()["paths"][path][method.lower()]["responses"]
    by_name = {op["include-name"]: op for op in tomllib.loads(_operations_config("svc_sess_x"))["operations"]}
    for name in ISSUE_42_NINE:
        accepted = by_name.get(name, {}).get("checks", {}).get("positive_data_acceptance", {})
        assert "400" not in accepted.get("expected-statuses", []), name
    paths = client.get("/openapi.json").get_json()["paths"]
    for name in SEMANTIC_422:
        method, path = name.split(" ", 1)
        assert "422" in paths[path][method.lower()]["responses"], name
        assert "422" in by_name[name]["checks"]["positive_data_acceptance"]["expected-statuses"]


@pytest.mark.parametrize("url", [
    "https://shop.example/back?x=1", "http://shop.example", "https://shop.example#done",
    "http://\U000a263b|\U000238d3@\u00bd%\u00ca\u00a3",  # generated by the fuzz run: userinfo after a '|'
    "https://user@shop.example/", "https://shop.example\\@evil.example/", "https://shop.example/a b",
    "https://shop.example/\u0085", "ftp://shop.example/", "https://", "https:///path"])
def test_the_return_url_pattern_refuses_what_the_redirect_rule_refuses(app, components, url):
    """Outside production, with no ``RETURN_URL_HOSTS`` (the configuration the fuzz run
    serves), the published pattern and ``redirects.problem`` agree on these URLs."""
    from app.services.platform import redirects

    with app.app_context():
        allowed = redirects.problem(url) is None
    assert _valid(components["Checkout"]["properties"]["return_url"], url) is allowed


# Strings that sit on the edges where Python's and ECMA-262's regular expressions differ
# (``$`` before a final newline, ``\Z``, whitespace and control classes, astral characters)
# or where the published patterns draw their lines.
PATTERN_SAMPLES = [
    "", "a", "Alice", "Z", "AliceZ", "abc\n", "abc\nZ", "\n", "a\tb", "a\r\nb", "a\x00", "a\x1f",
    "a\x7f", "a\x85", "a\x9f", "a\xa0", "a\u2028b", " a", "a ", "\ufeffa", "\U0001f600", "Ünïcödé",
    "=?", "a=?b", "a=", "==", "a==b", "=?=", "signup_started", "a:b.c-d_e", "12345", "12345\n",
    "pm_abc", "pm_abc\n", "x@y.z", "Bob.Smith+tag@example.co.uk", "bob@example", "bob@-x.com",
    "a" * 65 + "@example.com", "bob@example.com\n", "https://shop.example/x", "http://a",
    "https://u@a/", "https://a/\u0085", "https://a b/", "https://a?x", "ftp://a",
    "0x" + "a" * 40, "0x" + "a" * 130, "ed25519:" + "1" * 44, "base58:" + "2" * 88,
    "1" * 32, "0" * 32, "Abcdefgh", "1" * 18, "1" * 19, "ab-c", "-abc", "svc_live_abc",
]


def _published_patterns(doc) -> set[str]:
    found: set[str] = set()
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "pattern" and isinstance(value, str):
                    found.add(value)
                else:
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return found


def test_published_patterns_mean_in_ecma_262_what_the_server_applies(client):
    """JSON Schema's ``pattern`` is an ECMA-262 regular expression: every pattern of the
    document must compile there (with the ``u`` flag, as Ajv compiles them) and match
    exactly the strings the server's validation matches — ``fullmatch`` for an anchored
    pattern, a search for the unanchored ones inside ``not``. Python's ``\\Z`` failed
    this: ECMA has no such escape (an error with ``u``, a literal "Z" without it), so 47
    patterns refused every value without a "Z" in any JavaScript validator. Checked with
    node (on the machine image; deploy/system-packages.sh installs it otherwise)."""
    import json
    import re
    import subprocess

    patterns = sorted(_published_patterns(client.get("/openapi.json").get_json()))
    assert len(patterns) > 10
    script = ("const [ps, ss] = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "console.log(JSON.stringify(ps.map(p => { const r = new RegExp(p, 'u');"
              " return ss.map(s => r.test(s)); })));")
    out = subprocess.run(["node", "-e", script], input=json.dumps([patterns, PATTERN_SAMPLES]),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    ecma = json.loads(out.stdout)
    for pattern, verdicts in zip(patterns, ecma):
        rx = re.compile(pattern)
        anchored = pattern.startswith("^") and pattern.endswith("$")
        for sample, ecma_says in zip(PATTERN_SAMPLES, verdicts):
            python_says = (rx.fullmatch(sample) if anchored else rx.search(sample)) is not None
            assert python_says == ecma_says, (pattern, sample)


ALERT = {"name": "n", "metric": "calls", "op": ">", "threshold": 1, "window": "day"}
ALERT_TARGETS = [
    ("email", "Ops@Example.com"), ("email", "  ops@example.com "), ("email", "ops@example.com\u3000"),
    ("email", "a.b+c@mail.example.co"), ("email", "a=?b@example.com"), ("email", "\u212a@example.com"),
    ("email", "not-an-email"), ("email", "a@b"), ("email", "a@-b.example"), ("email", "a" * 65 + "@example.com"),
    ("email", "https://hooks.example.com/x"), ("email", "a@b.example\n"),
    ("webhook", "https://hooks.example.com/x"), ("webhook", " https://hooks.example.com/x?a=1 "),
    ("webhook", "https://hooks.example.com?x=1"), ("webhook", "https://hooks.example.com#f"),
    ("webhook", "https://u@hooks.example.com/"), ("webhook", "ftp://hooks.example.com/"),
    ("webhook", "ops@example.com"), ("webhook", "https://hooks.example.com/a b"),
    ("chat", "https://chat.example/hook"), ("chat", "not a url"), ("chat", "http://chat.example"),
]


def test_an_alert_target_is_published_as_the_server_checks_it(client, make_account, components):
    """The target's shape depends on the channel (an e-mail address, or a URL); the
    document states it with ``if``/``then`` and the server checks the same patterns, so
    a target valid by the published schema is created and one it rejects is refused.
    Before, the document said only "1–2000 characters" and the fuzz run could not tell
    the two apart (with ``https://hooks.example.com?x=1`` accepted for a webhook). The
    host's addresses stay the server's (DNS; private hosts are allowed in this config)."""
    schema = components["AlertCreate"]
    account = make_account(plan="enterprise")  # 1,000 requests a second: no 429 here
    for channel, target in ALERT_TARGETS:
        body = {**ALERT, "channel": channel, "target": target}
        r = client.post("/api/alerts", json=body, headers=account.headers)
        assert r.status_code in (201, 400), r.get_json()
        assert _valid(schema, body) == (r.status_code == 201), (channel, target, r.get_json())


def test_every_operation_taking_org_id_documents_the_404_it_answers_for_a_foreign_one(client, account):
    """``org_id`` of an organisation the caller is not a member of answers 404 on every route
    that takes it (``acting_account``), so each such operation documents that 404."""
    doc = client.get("/openapi.json").get_json()
    schemas = doc["components"]["schemas"]

    def body_props(op):
        schema = ((op.get("requestBody") or {}).get("content") or {}).get("application/json", {}).get("schema", {})
        while "$ref" in schema:
            schema = schemas[schema["$ref"].rsplit("/", 1)[1]]
        return schema.get("properties") or {}

    taking = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            if any(p["name"] == "org_id" for p in op.get("parameters", [])) or "org_id" in body_props(op):
                taking.append(f"{method.upper()} {path}")
                assert "404" in op["responses"], f"{method.upper()} {path}"
                assert "org_id" in op["responses"]["404"]["description"], f"{method.upper()} {path}"
    assert "PUT /api/account/billing-details" in taking and "GET /api/pay/invoices" in taking
    foreign = {"org_id": "org_" + "A" * 20}
    assert client.put("/api/account/billing-details", json=foreign, headers=account.headers).status_code == 404
    assert client.get("/api/pay/invoices", query_string=foreign, headers=account.headers).status_code == 404
