"""``POST /v1/messages/count_tokens`` (Anthropic's ``messages.count_tokens``): the gateway's
own estimate of a Messages request's prompt (chat/tokens.py on the translated body, the one
a hold is sized with), free, authenticated and refused as ``/v1/messages`` is.

Figures (tests/chatfakes.py): m-small's upstreams are counted by the rule of thumb (CHARS),
so ``[{"role": "user", "content": "hello there"}]`` is 3 + 4 + ceil(11 / 4) = 10 tokens;
m-claude's upstream (``claude-test``) by cl100k × 1.3."""
from __future__ import annotations

import pytest
from sqlalchemy import func, select

from app.extensions import db
from app.models import ChatCompletion
from app.services.chat import tokens
from app.services.chat.messages import to_openai
from app.services.money import ledger
from tests.chatfakes import fakes, upstreams  # noqa: F401
from tests.support.clock import fresh_window

MSGS = [{"role": "user", "content": "hello there"}]
TOOL = {"name": "get_weather", "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
COUNT = "/v1/messages/count_tokens"


@pytest.fixture
def acct(make_account):
    return make_account(cents=100, test_key=True)


def count(client, key, **body):
    body.setdefault("messages", MSGS)
    return client.post(COUNT, json=body, headers={"x-api-key": key})


def tokens_of(client, key, **body) -> int:
    r = count(client, key, **body)
    assert r.status_code == 200, r.get_json()
    assert set(r.get_json()) == {"input_tokens"}
    return r.get_json()["input_tokens"]


def test_the_count_is_the_estimate_a_hold_is_sized_with(app, client, fakes, acct):
    assert tokens_of(client, acct.key, model="m-small") == 10
    req = {"model": "m-claude", "system": "Be brief.", "tools": [TOOL],
           "messages": MSGS + [{"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Weather?"}]}
    with app.app_context():
        expected = tokens.estimate_prompt_tokens(to_openai({**req, "max_tokens": None}),
                                                 tokens.estimator("claude-test"))
    assert tokens_of(client, acct.key, **req) == expected > 10
    # bearer auth too, and a max_tokens sent anyway is ignored (not required)
    r = client.post(COUNT, json={**req, "max_tokens": 5}, headers={"Authorization": f"Bearer {acct.key}"})
    assert r.status_code == 200 and r.get_json() == {"input_tokens": expected}
    assert r.headers["request-id"] == r.headers["X-Request-Id"]
    assert tokens_of(client, acct.test_key, model="m-small") > 0  # a test key: the sandbox's estimate


def test_a_message_with_the_counted_prompt_holds_for_that_count(app, client, fakes, make_account):
    """The 402 of a balance too small names the hold (``X-Price-Micros``): the counted input
    tokens and ``max_tokens`` at m-claude's prices, to the micro-dollar."""
    from app.services.chat.catalog import catalog

    poor = make_account(cents=0)
    req = {"model": "m-claude", "system": "Be brief.", "tools": [TOOL],
           "messages": [{"role": "user", "content": "What is the weather in Paris? " * 20}]}
    n = tokens_of(client, poor.key, **req)
    r = client.post("/v1/messages", json={**req, "max_tokens": 100}, headers={"x-api-key": poor.key})
    assert r.status_code == 402, r.get_json()
    with app.app_context():
        hold = catalog().models["m-claude"].primary.cost_micros(n, 100)
    assert int(r.headers["X-Price-Micros"]) == hold > 0


def test_tokens_grow_with_content_system_and_tools(client, fakes, acct):
    base = tokens_of(client, acct.key, model="m-claude")
    longer = tokens_of(client, acct.key, model="m-claude",
                       messages=[{"role": "user", "content": "hello there " * 50}])
    system = tokens_of(client, acct.key, model="m-claude", system=[{"type": "text", "text": "You are terse."}])
    tools = tokens_of(client, acct.key, model="m-claude", tools=[TOOL])
    more_tools = tokens_of(client, acct.key, model="m-claude", tools=[TOOL, {**TOOL, "name": "get_time"}])
    blocks = tokens_of(client, acct.key, model="m-claude", messages=MSGS + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"}]}])
    assert base < system and base < longer and base < tools < more_tools and base < blocks
    assert tokens_of(client, acct.key, model="auto") > 0


def test_unknown_model_is_the_messages_apis_404(client, fakes, acct):
    r = count(client, acct.key, model="nope")
    made = client.post("/v1/messages", json={"model": "nope", "max_tokens": 5, "messages": MSGS},
                       headers={"x-api-key": acct.key})
    assert r.status_code == made.status_code == 404
    body = r.get_json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert body["error"]["code"] == "model_not_found"
    assert body["error"]["message"] == made.get_json()["error"]["message"]
    assert r.headers["request-id"] == body["request_id"]


@pytest.mark.parametrize("body,param", [
    ({"model": "m-small"}, "messages"),
    ({"model": "m-small", "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({"model": "m-small", "messages": [{"role": "user", "content": [{"type": "document"}]}]},
     "messages.0.content.0"),
    ({"messages": MSGS}, "model"),
    ({"model": "m-small", "messages": MSGS, "system": 5}, "system"),
])
def test_a_bad_body_is_anthropics_400(client, fakes, acct, body, param):
    r = client.post(COUNT, json=body, headers={"x-api-key": acct.key})
    assert r.status_code == 400, r.get_json()
    err = r.get_json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert param in err["error"]["message"]


def test_refusals_of_a_request_no_model_serves_are_the_messages_apis(client, fakes, acct):
    r = count(client, acct.key, model="m-small", tools=[TOOL])  # m-small has no tools
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "no_matching_model"
    r = count(client, acct.key, model="m-small", messages=[{"role": "user", "content": "word " * 2000}])
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "context_length_exceeded"


def test_no_money_moves_and_no_completion_is_recorded(app, client, fakes, make_account, ledger_clean):
    poor = make_account(cents=0)  # a balance that could not cover any hold
    with app.app_context():
        before = (ledger.balance(ledger.customer(poor.id)), ledger.balance(ledger.REVENUE),
                  ledger.balance("hold:chat"), db.session.scalar(select(func.count()).select_from(ChatCompletion)))
        db.session.remove()
    for model in ("m-small", "m-claude", "auto"):
        assert tokens_of(client, poor.key, model=model) > 0
    assert sum(f.calls for f in fakes.states.values()) == 0  # no provider was called
    with app.app_context():
        after = (ledger.balance(ledger.customer(poor.id)), ledger.balance(ledger.REVENUE),
                 ledger.balance("hold:chat"), db.session.scalar(select(func.count()).select_from(ChatCompletion)))
        db.session.remove()
    assert after == before
    ledger_clean()


def _key(client, acct, **body) -> str:
    r = client.post("/api/keys", json={"name": "k", **body}, headers=acct.headers)
    assert r.status_code == 201, r.get_json()
    return r.get_json()["key"]


def test_the_keys_allowed_models_apply_and_its_rpm_does_not_count_it(client, fakes, acct, ledger_clean):
    key = _key(client, acct, allowed_models=["m-big"], rpm_limit=1)
    fresh_window()  # the counted requests below in one window
    r = count(client, key, model="m-small")
    assert r.status_code == 403, r.get_json()
    err = r.get_json()
    assert err["type"] == "error" and err["error"]["type"] == "permission_error"
    assert err["error"]["code"] == "model_not_allowed" and "m-small" in err["error"]["message"]
    for _ in range(3):  # counting is not a model call: not in the key's rpm
        assert tokens_of(client, key, model="m-big") == 10
    assert tokens_of(client, key, model="auto") == 10  # auto: among the allowed models only
    made = client.post("/v1/messages", json={"model": "m-big", "max_tokens": 5, "messages": MSGS},
                       headers={"x-api-key": key})
    assert made.status_code == 200, made.get_json()
    ledger_clean()


def test_authentication_and_scope_are_the_messages_apis(client, fakes, make_account):
    r = client.post(COUNT, json={"model": "m-small", "messages": MSGS})
    assert r.status_code == 401 and r.get_json()["error"]["type"] == "authentication_error"
    r = client.post(COUNT, json={"model": "m-small", "messages": MSGS}, headers={"x-api-key": "svc_live_nope"})
    assert r.status_code == 401 and r.get_json()["type"] == "error"
    narrow = make_account(scopes=("keys:read",))
    r = client.post(COUNT, json={"model": "m-small", "messages": MSGS}, headers={"x-api-key": narrow.key})
    assert r.status_code == 403 and r.get_json()["error"]["type"] == "permission_error"


def test_the_plans_rate_limit_counts_it(client, fakes, make_account):
    """Free, but a request as any other: the plan's limit (the starter plan's requests per
    second for the account) refuses it with Anthropic's 429."""
    acct = make_account(cents=0)
    for _ in range(40):
        r = count(client, acct.key, model="m-small")
        if r.status_code != 200:
            break
    assert r.status_code == 429, r.get_json()
    assert r.get_json()["error"]["type"] == "rate_limit_error" and r.headers["Retry-After"]
