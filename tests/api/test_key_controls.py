"""Per-key controls (issue 39 item 5): allow-lists of models and modules, requests and
tokens per minute, set at creation or with PATCH, shown in the key's JSON, enforced on the
module gateway (modules + rpm) and the chat host (models + rpm + tpm), counted in the store
every worker shares (Redis when configured, else PostgreSQL), refused requests not counted.

Token figures (tests/chatfakes.py): the prompt estimate of MSGS is 10 tokens; the healthy
fakes report 100 prompt + 50 completion tokens = 150 per completion."""
from __future__ import annotations

import anthropic
import openai
import pytest
from sqlalchemy import text

from app.extensions import db
from tests.chatfakes import fakes, live_server, upstreams  # noqa: F401
from tests.gateway_helpers import call, mod, provider, provider_server  # noqa: F401
from tests.support.clock import fresh_window

MSGS = [{"role": "user", "content": "hello there"}]


def _key(client, acct, **body):
    r = client.post("/api/keys", json={"name": "k", **body}, headers=acct.headers)
    assert r.status_code == 201, r.get_json()
    return r.get_json()


def _chat(client, key, **body):
    body.setdefault("messages", MSGS)
    return client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def test_controls_are_set_validated_shown_and_removed(client, make_account):
    account = make_account(plan="scale")  # more requests in a second than the starter plan allows
    key = _key(client, account, allowed_models=["m-small", "m-small"], rpm_limit=5)
    assert (key["allowed_models"], key["allowed_modules"], key["rpm_limit"], key["tpm_limit"]) == \
        (["m-small"], None, 5, None)
    for bad in ({"rpm_limit": 0}, {"tpm_limit": "10"}, {"allowed_models": "m-small"},
                {"allowed_modules": [""]}, {"allowed_models": ["x"] * 101}, {"rpm_limit": True}):
        r = client.patch(f"/api/keys/{key['id']}", json=bad, headers=account.headers)
        assert r.status_code == 400, (bad, r.get_json())
    r = client.patch(f"/api/keys/{key['id']}", json={"allowed_modules": ["text"], "tpm_limit": 1000},
                     headers=account.headers)
    assert r.status_code == 200, r.get_json()
    shown = r.get_json()
    assert (shown["allowed_models"], shown["allowed_modules"], shown["rpm_limit"], shown["tpm_limit"]) == \
        (["m-small"], ["text"], 5, 1000)
    assert shown["spend_limit_cents"] is None  # a controls-only PATCH leaves the spend limit alone
    r = client.patch(f"/api/keys/{key['id']}", json={"allowed_models": None, "rpm_limit": None},
                     headers=account.headers)
    listed = {k["id"]: k for k in client.get("/api/keys", headers=account.headers).get_json()["keys"]}
    assert (listed[key["id"]]["allowed_models"], listed[key["id"]]["rpm_limit"]) == (None, None)
    assert listed[key["id"]]["allowed_modules"] == ["text"]
    r = client.post(f"/api/keys/{key['id']}/rotate", json={}, headers=account.headers)
    assert r.status_code == 201, r.get_json()
    rotated = r.get_json()
    assert (rotated["allowed_modules"], rotated["tpm_limit"]) == (["text"], 1000)  # the successor keeps them


def test_module_allow_list_and_rpm_on_the_module_gateway(app, client, make_account, mod):
    acct = make_account(cents=100)
    key = _key(client, acct, allowed_modules=["svc"], rpm_limit=2)
    fresh_window()  # the three calls below in one minute window
    r = call(client, acct, {"action": "ok"}, slug="text", bearer=key["key"])
    assert r.status_code == 403 and r.get_json()["error"] == "module_not_allowed"
    assert "'text'" in r.get_json()["message"] and "svc" in r.get_json()["message"]
    assert call(client, acct, {"action": "ok"}, bearer=key["key"]).status_code == 200
    r = call(client, acct, {"action": "ok"}, bearer=key["key"])
    assert r.status_code == 200
    r = call(client, acct, {"action": "ok"}, bearer=key["key"])
    assert r.status_code == 429 and r.get_json()["error"] == "rate_limited"
    assert "requests-per-minute limit of 2" in r.get_json()["message"]
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    # the account's other keys are not limited by this key's controls
    assert call(client, acct, {"action": "ok"}, slug="svc").status_code == 200
    # raising the limit applies at once on every worker (the cached credential is dropped)
    client.patch(f"/api/keys/{key['id']}", json={"rpm_limit": 3}, headers=acct.headers)
    assert call(client, acct, {"action": "ok"}, bearer=key["key"]).status_code == 200  # refusals were not counted


def test_model_allow_list_on_the_chat_host(app, client, fakes, make_account, ledger_clean):
    acct = make_account(cents=100)
    key = _key(client, acct, allowed_models=["m-big"])["key"]
    r = _chat(client, key, model="m-small")
    err = r.get_json()["error"]
    assert r.status_code == 403 and err["code"] == "model_not_allowed" and err["param"] == "model"
    assert err["type"] == "permission_error" and "'m-small'" in err["message"] and "m-big" in err["message"]
    r = _chat(client, key, model="auto")  # auto routes among the allowed models only
    assert r.status_code == 200 and r.get_json()["model"] == "m-big"
    r = client.post("/v1/messages", json={"model": "m-small", "max_tokens": 100, "messages": MSGS},
                    headers={"x-api-key": key})
    assert r.status_code == 403 and r.get_json()["error"]["type"] == "permission_error"
    assert r.get_json()["type"] == "error" and "m-small" in r.get_json()["error"]["message"]
    # the key's model list names what it may use (it listed every model), as OpenAI's does
    # for a restricted project; a model outside it is not found for this key
    auth = {"Authorization": f"Bearer {key}"}
    assert [m["id"] for m in client.get("/v1/models", headers=auth).get_json()["data"]] == ["auto", "m-big"]
    assert client.get("/v1/models/m-small", headers=auth).status_code == 404
    assert client.get("/v1/models/m-big", headers=auth).status_code == 200
    assert "m-small" in [m["id"] for m in client.get(
        "/v1/models", headers={"Authorization": f"Bearer {acct.key}"}).get_json()["data"]]
    ledger_clean()


def test_tokens_per_minute_count_the_provider_tokens(app, client, fakes, make_account, ledger_clean):
    acct = make_account(cents=100)
    key = _key(client, acct, tpm_limit=320, rpm_limit=50)["key"]
    fresh_window()  # the counted requests below in one window
    assert _chat(client, key, model="m-small").status_code == 200  # 10 estimated, corrected to 150
    assert _chat(client, key, model="m-small").status_code == 200  # 150 + 10 fits; now 300
    r = _chat(client, key, model="m-small")  # 300 + 10 fits: admitted, ends at 450
    assert r.status_code == 200
    r = _chat(client, key, model="m-small")
    err = r.get_json()["error"]
    assert r.status_code == 429 and err["code"] == "rate_limited" and err["type"] == "rate_limit_error"
    assert "tokens-per-minute limit of 320" in err["message"] and r.headers["Retry-After"]
    other = _key(client, acct, tpm_limit=100)["key"]
    r = _chat(client, other, model="m-small", max_tokens=200)  # 10 + 200 can never fit 100
    assert r.status_code == 429 and "this request alone is estimated at 210 tokens" in r.get_json()["error"]["message"]
    ledger_clean()


def test_a_request_the_tpm_limit_refuses_does_not_count_against_the_rpm_limit(app, client, fakes, make_account,
                                                                            ledger_clean):
    """A refused request counts in no window: a completion refused 429 by the key's tokens
    per minute must not use up its requests per minute (it did: two tpm refusals left no
    request of an rpm limit of 2)."""
    acct = make_account(cents=100)
    key = _key(client, acct, rpm_limit=2, tpm_limit=400)["key"]
    fresh_window()  # the counted requests below in one window
    for _ in range(2):  # 10 + 500 estimated: never fits 400
        r = _chat(client, key, model="m-small", max_tokens=500)
        assert r.status_code == 429 and "tokens-per-minute" in r.get_json()["error"]["message"]
    for _ in range(2):  # 11 estimated, 150 each: the rpm limit's two requests are still there
        r = _chat(client, key, model="m-small", max_tokens=1)
        assert r.status_code == 200, r.get_json()
    r = _chat(client, key, model="m-small", max_tokens=1)
    assert r.status_code == 429 and "requests-per-minute" in r.get_json()["error"]["message"]
    ledger_clean()


def test_a_failed_completion_gives_its_tokens_back(app, client, fakes, make_account):
    acct = make_account(cents=100)
    key = _key(client, acct, tpm_limit=250)["key"]
    fresh_window()  # the counted requests below in one window
    fakes.cheap.mode = fakes.pricey.mode = "503"
    for _ in range(3):  # each one 10 + 200 estimated, given back when every provider fails
        assert _chat(client, key, model="m-small", max_tokens=200).status_code == 502
    fakes.cheap.mode = fakes.pricey.mode = "ok"
    assert _chat(client, key, model="m-small", max_tokens=200).status_code == 200


def test_counters_are_shared_through_the_store_every_worker_uses(app, client, make_account, mod):
    """Without Redis the counters are PostgreSQL rows (rate_windows, as the plan's: the
    embedded default's workers share them); with Redis they are Redis keys."""
    acct = make_account(cents=100)
    key = _key(client, acct, rpm_limit=5)
    fresh_window()  # the counted requests below in one window
    call(client, acct, {"action": "ok"}, bearer=key["key"])
    with app.app_context():
        rows = db.session.execute(text("SELECT key, win[2] FROM rate_windows WHERE key LIKE :k"),
                                  {"k": f"key:{key['id']}:%"}).all()
        db.session.remove()
    if app.config["RATELIMIT_STORAGE_URI"].startswith("redis"):
        assert rows == []
    else:
        assert rows == [(f"key:{key['id']}:rpm:60", 1)]


def test_the_official_clients_show_the_403(app, fakes, make_account):
    acct = make_account(cents=100)
    with app.test_client() as c:
        key = _key(c, acct, allowed_models=["m-big"])["key"]
    with live_server(app, "key-controls") as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.PermissionDeniedError) as exc:
            client.chat.completions.create(model="m-small", messages=MSGS)
        assert exc.value.code == "model_not_allowed" and "may not use model 'm-small'" in str(exc.value)
        done = client.chat.completions.create(model="auto", messages=MSGS)
        assert done.model == "m-big"
        aclient = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
        with pytest.raises(anthropic.PermissionDeniedError) as aexc:
            aclient.messages.create(model="m-small", max_tokens=100, messages=MSGS)
        assert "may not use model 'm-small'" in str(aexc.value)


def test_a_rotation_shares_one_rpm_limit(app, client, make_account, mod):
    """The old key (in its overlap) counts on its successor's counter: rotating does not
    double the key's rate."""
    acct = make_account(cents=100)
    old = _key(client, acct, rpm_limit=2)
    fresh_window()  # the counted requests below in one window
    new = client.post(f"/api/keys/{old['id']}/rotate", json={}, headers=acct.headers).get_json()
    assert new["rpm_limit"] == 2
    assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 200
    assert call(client, acct, {"action": "ok"}, bearer=new["key"]).status_code == 200
    assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 429
    assert call(client, acct, {"action": "ok"}, bearer=new["key"]).status_code == 429


def test_a_retiring_key_follows_its_successors_rates(app, client, make_account, mod):
    """What is counted on the rotation's one counter is limited by the successor's values: an
    rpm limit set (or lowered) on the new key after the rotation holds the old key in its
    overlap too, as its spend limit does; its own rates cannot be changed (409 key_retiring),
    its allow-lists can (docs/decisions.md "A retiring key's rates are its successor's")."""
    acct = make_account(cents=100, plan="scale")
    for own in (None, 5):
        old = _key(client, acct, **({"rpm_limit": own} if own else {}))
        new = client.post(f"/api/keys/{old['id']}/rotate", json={}, headers=acct.headers).get_json()
        r = client.patch(f"/api/keys/{new['id']}", json={"rpm_limit": 1}, headers=acct.headers)
        assert r.status_code == 200, r.get_json()
        listed = {k["id"]: k for k in client.get("/api/keys", headers=acct.headers).get_json()["keys"]}
        assert listed[old["id"]]["rpm_limit"] == 1
        fresh_window()
        assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 200
        assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 429, own
        assert call(client, acct, {"action": "ok"}, bearer=new["key"]).status_code == 429
    r = client.patch(f"/api/keys/{old['id']}", json={"rpm_limit": 50}, headers=acct.headers)
    assert r.status_code == 409 and r.get_json()["error"] == "key_retiring"
    r = client.patch(f"/api/keys/{old['id']}", json={"allowed_modules": ["text"]}, headers=acct.headers)
    assert r.status_code == 200 and r.get_json()["allowed_modules"] == ["text"]


def test_an_unreachable_redis_fails_open_like_the_plan_limit(app, client, make_account, mod, monkeypatch):
    acct = make_account(cents=100)
    key = _key(client, acct, rpm_limit=1)["key"]
    fresh_window()  # the counted requests below in one window
    monkeypatch.setitem(app.config, "RATELIMIT_STORAGE_URI", "redis://127.0.0.1:1/0")  # nothing listens
    assert call(client, acct, {"action": "ok"}, bearer=key).status_code == 200
    assert call(client, acct, {"action": "ok"}, bearer=key).status_code == 200


def test_a_passing_request_reports_the_limit_closest_to_refusing(app, client, make_account, mod, monkeypatch):
    """`RateLimit-*` on a passing request named the plan's first window only: a key with an
    rpm limit of 3 got `RateLimit-Limit: 60000`, `RateLimit-Remaining: 59981` on its three
    200s and then a 429 saying `RateLimit-Limit: 3` — a client pacing itself by the headers
    ran into the refusal they never announced; so did a plan whose later window (a day) was
    the tighter one. The headers name the window closest to refusing (fewest remaining), as
    the RateLimit header fields draft asks when several policies apply."""
    monkeypatch.setitem(app.config["PLANS"], "pro", {"plan_cents": 5000, "rate_limit": "100/hour;50/day"})
    acct = make_account(cents=100, plan="pro")
    key = _key(client, acct, rpm_limit=3)
    fresh_window()
    for left in (2, 1, 0):
        r = call(client, acct, {"action": "ok"}, bearer=key["key"])
        assert r.status_code == 200
        assert (r.headers["RateLimit-Limit"], r.headers["RateLimit-Remaining"]) == ("3", str(left)), r.headers
        assert 1 <= int(r.headers["RateLimit-Reset"]) <= 60
    r = call(client, acct, {"action": "ok"}, bearer=key["key"])
    assert r.status_code == 429 and (r.headers["RateLimit-Limit"], r.headers["RateLimit-Remaining"]) == ("3", "0")
    # the account's own key (no rpm): the plan's day window has fewer left than its hour; six
    # requests counted (the key's creation, four calls — the plan admitted the one the rpm
    # limit refused — and this one): 44 of 50 against 94 of 100
    r = call(client, acct, {"action": "ok"})
    assert r.status_code == 200
    assert (r.headers["RateLimit-Limit"], r.headers["RateLimit-Remaining"]) == ("50", "44"), r.headers
    assert 3600 < int(r.headers["RateLimit-Reset"]) <= 86_400
