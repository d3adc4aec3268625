"""Chat host: routing, failover, cost, savings and ledger figures against local fake upstreams.

Figures used throughout (see tests/chatfakes.py):
* messages ``[{"role": "user", "content": "hello there"}]`` → the gateway's prompt estimate is
  3 + 4 + ceil(11 / 4) = 10 tokens;
* healthy OpenAI-shaped fakes report 100 prompt + 50 completion tokens;
* m-small: pricey (primary, $3/$6 per Mtok) and cheap ($1/$2); m-big: pricey $5/$15;
  the auto reference model is m-big.
"""
from __future__ import annotations

import orjson
import pytest
from sqlalchemy import select

from app.extensions import db
from app.models import ChatCompletion, LedgerTransaction
from app.services.money import ledger
from app.services.billing import usage
from tests.chatfakes import fakes, upstreams  # noqa: F401

MSGS = [{"role": "user", "content": "hello there"}]
START = 1_000_000  # 100 cents


@pytest.fixture
def acct(make_account):
    return make_account(cents=100, test_key=True)


def chat(client, acct, key=None, **body):
    body.setdefault("messages", MSGS)
    return client.post("/v1/chat/completions", json=body,
                       headers={"Authorization": f"Bearer {key or acct.key}"})


def figures(app, account_id):
    with app.app_context():
        out = {"balance": ledger.balance(ledger.customer(account_id)),
               "revenue": ledger.balance(ledger.REVENUE), "held": ledger.balance("hold:chat")}
        start, end = usage.billing_period()
        out["usage"] = usage.totals(account_id, start, end)
        db.session.remove()
    return out


def test_named_model_goes_to_cheapest_provider_and_settles_exact_cost(app, client, fakes, acct, ledger_clean):
    r = chat(client, acct, model="m-small", max_tokens=100)
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "m-small" and body["provider"] == "cheap"
    assert body["choices"][0]["message"]["content"] == "Hello from cheap"
    # 100 × 1 + 50 × 2 = 200 micros; reference = primary (pricey) 100 × 3 + 50 × 6 = 600
    assert body["usage"] == {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150,
                             "cost_usd": 0.0002, "cost_micros": 200, "savings_pct": 66.67,
                             "latency_ms": body["usage"]["latency_ms"], "estimated": False, "cost": 0.0002}
    assert isinstance(body["usage"]["latency_ms"], int) and body["usage"]["latency_ms"] >= 0
    assert r.headers["X-Chat-Provider"] == "cheap" and r.headers["X-Chat-Attempts"] == "1"
    assert r.headers["X-Chat-Model"] == "m-small" and r.headers["X-Chat-Cost-Micros"] == "200"
    # the cost headers every client can read (LiteLLM keeps them as llm_provider-x-gateway-*)
    assert r.headers["X-Gateway-Cost-Micros"] == "200" and r.headers["X-Gateway-Savings-Pct"] == "66.67"
    assert float(r.headers["X-Gateway-Overhead-Ms"]) >= 0
    assert fakes.cheap.bodies[0]["model"] == "small-at-cheap" and fakes.cheap.bodies[0]["max_tokens"] == 100
    assert fakes.pricey.calls == 0
    f = figures(app, acct.id)
    assert f == {"balance": START - 200, "revenue": 200, "held": 0,
                 "usage": {"calls": 1, "errors": 0, "spend_micros": 200}}
    with app.app_context():
        row = db.session.get(ChatCompletion, body["id"])
        # hold = prompt estimate 10 + max_tokens 100 at the dearest candidate (pricey): 10×3 + 100×6
        assert (row.status, row.hold_micros, row.cost_micros, row.provider) == ("settled", 630, 200, "cheap")
        kinds = db.session.execute(select(LedgerTransaction.kind, LedgerTransaction.ref)
                                   .where(LedgerTransaction.account_id == acct.id)
                                   .order_by(LedgerTransaction.id)).all()
        assert kinds == [("chat_hold", f"chat_hold:{body['id']}"), ("chat_settle", f"chat_settle:{body['id']}")]
    ledger_clean()


@pytest.mark.parametrize("failure", ["503", "429", "timeout", "401"])
def test_failover_from_failing_cheap_provider_to_healthy_expensive_one(app, client, fakes, acct, failure,
                                                                     ledger_clean):
    fakes.cheap.mode = failure
    r = chat(client, acct, model="m-small", max_tokens=100)
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert body["provider"] == "pricey" and r.headers["X-Chat-Attempts"] == "2"
    assert fakes.cheap.calls == 1 and fakes.pricey.calls == 1
    assert fakes.pricey.bodies[0]["model"] == "small-at-pricey"
    # 100 × 3 + 50 × 6 = 600 = the reference price: nothing saved (never negative)
    assert body["usage"]["cost_micros"] == 600 and body["usage"]["savings_pct"] == 0.0
    assert figures(app, acct.id) == {"balance": START - 600, "revenue": 600, "held": 0,
                                     "usage": {"calls": 1, "errors": 0, "spend_micros": 600}}
    ledger_clean()


def test_retry_after_cools_the_provider_down(app, client, fakes, acct):
    fakes.cheap.mode, fakes.cheap.retry_after = "429", "5"
    assert chat(client, acct, model="m-small").headers["X-Chat-Attempts"] == "2"
    r = chat(client, acct, model="m-small")
    assert r.status_code == 200 and r.headers["X-Chat-Attempts"] == "1"
    assert r.get_json()["provider"] == "pricey" and fakes.cheap.calls == 1


def test_repeated_failures_cool_the_provider_down(app, client, monkeypatch, fakes, acct):
    monkeypatch.setitem(app.config, "CHAT_COOLDOWN_FAILURES", 2)
    fakes.cheap.mode = "503"
    for _ in range(2):
        assert chat(client, acct, model="m-small").headers["X-Chat-Attempts"] == "2"
    r = chat(client, acct, model="m-small")
    assert r.headers["X-Chat-Attempts"] == "1" and fakes.cheap.calls == 2 and fakes.pricey.calls == 3


def test_retry_after_is_honoured_when_no_other_provider_is_left(app, client, monkeypatch, fakes, acct):
    monkeypatch.setitem(app.config, "CHAT_RETRY_AFTER_CAP", 1.0)
    fakes.pricey.mode, fakes.pricey.retry_after, fakes.pricey.fail_times = "429", "0.1", 1
    r = chat(client, acct, model="m-big", max_tokens=10)
    assert r.status_code == 200 and r.headers["X-Chat-Attempts"] == "2" and fakes.pricey.calls == 2


def test_all_candidates_failing_charges_nothing(app, client, fakes, acct, ledger_clean):
    fakes.cheap.mode = fakes.pricey.mode = "503"
    r = chat(client, acct, model="m-small")
    assert r.status_code == 502
    assert r.get_json()["error"]["code"] == "provider_error" and r.headers["X-Chat-Attempts"] == "2"
    assert figures(app, acct.id) == {"balance": START, "revenue": 0, "held": 0,
                                     "usage": {"calls": 1, "errors": 1, "spend_micros": 0}}
    with app.app_context():
        assert db.session.execute(select(ChatCompletion.status)).scalar_one() == "released"
    ledger_clean()


def test_a_single_failed_attempt_is_counted_in_the_singular(app, client, fakes, acct):
    fakes.pricey.mode = "503"  # m-big: pricey only
    r = chat(client, acct, model="m-big")
    assert r.status_code == 502 and r.headers["X-Chat-Attempts"] == "1"
    assert "(1 attempt: " in r.get_json()["error"]["message"]  # it said "(1 attempts: …)"


def test_all_candidates_timing_out_is_504(app, client, fakes, acct, ledger_clean):
    fakes.cheap.mode = fakes.pricey.mode = "timeout"
    r = chat(client, acct, model="m-small")
    assert r.status_code == 504 and r.get_json()["error"]["code"] == "provider_timeout"
    assert figures(app, acct.id)["balance"] == START
    ledger_clean()


def test_request_error_from_upstream_is_returned_not_failed_over(app, client, fakes, acct, ledger_clean):
    fakes.cheap.mode = "400"
    r = chat(client, acct, model="m-small")
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "invalid_request"
    assert "cheap says 400" in r.get_json()["error"]["message"]
    assert fakes.pricey.calls == 0 and figures(app, acct.id)["balance"] == START
    ledger_clean()


def test_auto_routes_to_cheapest_fitting_model(app, client, fakes, acct, ledger_clean):
    r = chat(client, acct, model="auto")
    body = r.get_json()
    assert (body["model"], body["provider"]) == ("m-small", "cheap")
    # reference m-big: 100 × 5 + 50 × 15 = 1250; cost 200 → 84 % saved
    assert body["usage"]["cost_micros"] == 200 and body["usage"]["savings_pct"] == 84.0
    with app.app_context():
        # no max_tokens: the hold covers CHAT_DEFAULT_HOLD_OUTPUT_TOKENS (1024) at the dearest
        # candidate, m-big: 10 × 5 + 1024 × 15 (it was 4000 × 15 with the 4096 default)
        assert db.session.execute(select(ChatCompletion.hold_micros)).scalar_one() == 15_410
    assert fakes.cheap.bodies[0]["max_tokens"] == 500  # m-small's max output
    ledger_clean()


def test_no_max_tokens_holds_the_bounded_allowance(app, client, fakes, make_account, monkeypatch, ledger_clean):
    """Issue 39 item 7: without max_tokens the hold covers CHAT_DEFAULT_HOLD_OUTPUT_TOKENS at
    the dearest candidate, so a small balance can chat; the provider is sent what that hold
    pays for at its own prices (never more than the hold covers)."""
    poor = make_account(cents=2)  # 20,000 micros: m-big's old hold (4000 × 15 = 60,000+) did not fit
    r = chat(client, poor, model="m-big")
    assert r.status_code == 200, r.get_json()
    assert fakes.pricey.bodies[-1]["max_tokens"] == 1024  # the only candidate: exactly the allowance
    monkeypatch.setitem(app.config, "CHAT_DEFAULT_HOLD_OUTPUT_TOKENS", 100)
    r = chat(client, poor, model="m-small")  # cheap first; the hold is priced at pricey ($3 / $6)
    assert r.status_code == 200 and r.get_json()["provider"] == "cheap", r.get_json()
    with app.app_context():
        hold = db.session.execute(select(ChatCompletion.hold_micros).where(
            ChatCompletion.id == r.headers["X-Chat-Completion-Id"])).scalar_one()
        db.session.remove()
    prompt = (hold - 100 * 6) // 3  # hold = prompt × 3 + 100 × 6
    sent = fakes.cheap.bodies[-1]["max_tokens"]
    assert sent == min(500, (hold - prompt * 1) // 2) and sent > 100  # cheap ($1 / $2) affords more
    ledger_clean()


def test_auto_matches_capabilities_and_context(app, client, fakes, acct, ledger_clean):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    r = chat(client, acct, model="auto", tools=tools, max_tokens=10)
    body = r.get_json()
    assert body["model"] == "m-big" and body["choices"][0]["message"]["tool_calls"][0]["function"] == {
        "name": "weather", "arguments": '{"city": "Paris"}'}
    # the fake reports 100 + 50 tokens, beyond the estimated prompt and the 10-token cap: the
    # charge is the exact cost (1250) but never more than the hold (issue 39 item 7)
    charged = [body["usage"]["cost_micros"]]
    long = [{"role": "user", "content": "x" * 4000}]  # ≈ 1007 tokens: beyond m-small's 1000
    r = chat(client, acct, model="auto", messages=long, max_tokens=10)
    assert r.get_json()["model"] == "m-big"
    charged.append(r.get_json()["usage"]["cost_micros"])
    r = chat(client, acct, model="auto", response_format={"type": "json_object"}, max_tokens=10)
    assert r.get_json()["model"] == "m-big"
    charged.append(r.get_json()["usage"]["cost_micros"])
    with app.app_context():
        holds = db.session.execute(select(ChatCompletion.hold_micros).order_by(ChatCompletion.created_at)).scalars().all()
        db.session.remove()
    assert charged == [min(1250, h) for h in holds] and charged[1] == 1250 and charged[0] < 1250
    # the savings compare what was charged with the reference (m-big itself: 1250), not the
    # uncapped cost: the capped one saved (1250 − charged) / 1250; they read 0 (cost = reference)
    assert body["usage"]["savings_pct"] == round((1250 - charged[0]) / 1250 * 100, 2) > 0
    assert figures(app, acct.id)["balance"] == START - sum(charged)
    ledger_clean()


def test_named_model_refusals(app, client, monkeypatch, fakes, acct):
    monkeypatch.setitem(app.config, "RATELIMIT_ENABLED", False)
    r = chat(client, acct, model="nope")
    assert r.status_code == 404 and r.get_json()["error"]["code"] == "model_not_found"
    r = chat(client, acct, model="m-offline")  # its provider has no key configured
    assert r.status_code == 404 and r.get_json()["error"]["code"] == "model_not_found"
    r = chat(client, acct, model="m-small", tools=[{"type": "function", "function": {"name": "f"}}])
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "no_matching_model"
    r = chat(client, acct, model="m-small", messages=[{"role": "user", "content": "x" * 4000}])
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "context_length_exceeded"
    r = chat(client, acct, model="auto", messages=[{"role": "user", "content": "x" * 2_000_000}])
    assert r.status_code in (400, 413)
    for bad in ({"messages": []}, {"messages": [{"role": "robot", "content": "hi"}]},
                {"messages": [{"role": "user"}]}, {"messages": "hi"}, {"max_tokens": 0},
                {"messages": [{"role": "tool", "content": "x"}]},
                {"messages": [{"role": "assistant", "content": None, "tool_calls": {"a": 1}}]},
                {"messages": MSGS, "tools": [{"type": "function"}]}, {"messages": [{"role": "user",
                                                                                   "content": 42}]}):
        r = chat(client, acct, model="m-small", **bad)
        assert r.status_code == 400 and r.get_json()["error"]["code"] == "invalid_request", bad
    assert fakes.cheap.calls == fakes.pricey.calls == 0
    assert figures(app, acct.id)["balance"] == START


def test_chat_402_is_the_module_402(app, client, fakes, make_account, ledger_clean):
    """One 402 shape: the chat 402 carries the SPEC part 7 headers, x402's payment request
    and the message pointing to POST /api/wallet/fund, like a module call's."""
    poor = make_account(cents=0)
    r = chat(client, poor, model="m-small", max_tokens=100)
    body = r.get_json()
    assert r.status_code == 402 and body["error"]["code"] == "payment_required"
    assert body["error"]["type"] == "insufficient_quota" and body["request_id"] == r.headers["X-Request-Id"]
    # OpenAI's error object, the 402's payment request beside it
    assert "POST /api/wallet/fund" in body["error"]["message"] and body["fund_endpoint"] == "POST /api/wallet/fund"
    assert r.headers["WWW-Authenticate"] == f'X402 realm="gateway", nonce="{r.headers["X-Nonce"]}"'
    assert r.headers["X-Price-Cents"] == "1" and body["price_cents"] == 1  # 630 micros, rounded up
    assert r.headers["X-Pay-To"] == app.config["X402_PAY_TO"] == body["pay_to"]
    assert body["nonce"] == r.headers["X-Nonce"]
    if app.config["X402_PAY_TO"]:
        assert "PAYMENT-REQUIRED" in r.headers and body["x402Version"] == 1
    ledger_clean()


def test_hold_covers_every_choice(app, client, fakes, acct, ledger_clean):
    r = chat(client, acct, model="m-small", max_tokens=100, n=2)
    assert r.status_code == 200 and r.get_json()["usage"]["cost_micros"] == 200
    with app.app_context():
        # 10 × 3 + 2 × 100 × 6 at the dearest candidate
        assert db.session.execute(select(ChatCompletion.hold_micros)).scalar_one() == 1_230
    assert chat(client, acct, model="m-small", n=17).status_code == 400
    ledger_clean()


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_an_output_cap_above_the_models_maximum_is_refused(app, client, fakes, acct, field, ledger_clean):
    """m-small allows 500 output tokens. A request for 100,000 was silently capped to 500
    (held and sent as 500), where OpenAI answers 400 ``max_tokens is too large`` and Anthropic
    400 ``max_tokens: N > M, which is the maximum allowed number of output tokens for …``: the
    caller never learnt its answer could be cut. Now refused before anything is held, in each
    API's words, naming the field the request used; the model's maximum itself is taken."""
    r = chat(client, acct, model="m-small", **{field: 100_000})
    assert r.status_code == 400, r.get_json()
    err = r.get_json()["error"]
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "invalid_request", field)
    assert err["message"] == (f"{field} is too large: 100000. This model supports at most 500 completion "
                              "tokens, whereas you provided 100000.")
    assert fakes.cheap.calls == fakes.pricey.calls == 0
    r = chat(client, acct, model="m-small", **{field: 500})
    assert r.status_code == 200, r.get_json()
    assert fakes.cheap.bodies[-1][field] == 500
    r = client.post("/v1/messages", headers={"x-api-key": acct.key},
                    json={"model": "m-small", "max_tokens": 501, "messages": MSGS})
    assert r.status_code == 400 and r.get_json()["type"] == "error", r.get_json()
    assert r.get_json()["error"]["type"] == "invalid_request_error"
    assert r.get_json()["error"]["message"] == ("max_tokens: 501 > 500, which is the maximum allowed number of "
                                                "output tokens for m-small")
    assert fakes.cheap.calls == 1
    with app.app_context():  # one completion: the refused ones held nothing
        assert len(db.session.execute(select(ChatCompletion.id)).all()) == 1
        db.session.remove()
    assert figures(app, acct.id)["held"] == 0
    ledger_clean()


def test_auto_routes_only_to_models_that_allow_the_output_asked_for(app, client, fakes, acct, ledger_clean):
    """``model: auto`` with ``max_tokens`` above a model's maximum routed to it anyway and
    capped the answer (m-small, 500); a model that cannot write what was asked for does not
    fit, as a named one refuses it: m-big (4,000) serves it. Above every model's maximum,
    400 ``no_matching_model`` saying so."""
    r = chat(client, acct, model="auto", max_tokens=1000)
    assert r.status_code == 200 and r.get_json()["model"] == "m-big", r.get_json()
    assert fakes.pricey.bodies[-1]["max_tokens"] == 1000 and fakes.cheap.calls == 0
    r = chat(client, acct, model="auto", max_tokens=100_000)
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "no_matching_model"
    assert "up to 100000 output tokens" in r.get_json()["error"]["message"]
    ledger_clean()


def test_the_price_lists_auto_picks_follow_the_routing_rule(app, fakes, monkeypatch):
    """The console's "Models and prices" page shows what ``auto`` picks; its own copy of the
    rule checked the context window only, so it named m-small for a 600-token answer that
    routing now gives m-big (m-small writes at most 500). It asks ``catalog.fits`` now."""
    from app.services.gateway import pricelist

    monkeypatch.setattr(pricelist, "AUTO_CASES", (("A long answer", frozenset(), 10, 600),))
    with app.app_context():
        assert [p["model"] for p in pricelist.auto_picks()] == ["m-big"]


def test_balance_must_cover_the_hold(app, client, fakes, make_account, ledger_clean):
    poor = make_account(cents=0)
    r = chat(client, poor, model="m-small", max_tokens=100)
    assert r.status_code == 402 and r.get_json()["error"]["code"] == "payment_required"
    assert r.headers["X-Price-Micros"] == "630"
    assert fakes.cheap.calls == fakes.pricey.calls == 0
    with app.app_context():
        assert db.session.execute(select(ChatCompletion)).first() is None
    ledger_clean()


def test_auth_and_scope(client, fakes, make_account):
    assert client.post("/v1/chat/completions", json={"model": "auto", "messages": MSGS}).status_code == 401
    reader = make_account(scopes=["call:read"])
    r = chat(client, reader, model="auto")
    assert r.status_code == 403 and r.get_json()["error"]["code"] == "insufficient_scope"


def _events(resp) -> list:
    out = []
    for block in resp.get_data().split(b"\n\n"):
        if block.startswith(b"data: "):
            payload = block[6:]
            out.append(payload if payload == b"[DONE]" else orjson.loads(payload))
    return out


def test_streaming_relays_chunks_and_ends_with_usage_and_done(app, client, fakes, acct, ledger_clean):
    r = chat(client, acct, model="m-small", max_tokens=100, stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200 and r.mimetype == "text/event-stream"
    assert r.headers["X-Chat-Provider"] == "cheap"
    events = _events(r)
    assert events[-1] == b"[DONE]"
    chunks = events[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["model"] for c in chunks} == {"m-small"} and len({c["id"] for c in chunks}) == 1
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "Hello from cheap"
    final = chunks[-1]
    assert final["choices"] == [] and final["usage"]["cost_micros"] == 200
    assert final["usage"]["estimated"] is False and final["usage"]["savings_pct"] == 66.67
    assert fakes.cheap.bodies[0]["stream_options"] == {"include_usage": True}
    assert figures(app, acct.id)["balance"] == START - 200
    ledger_clean()


def test_streaming_fails_over_before_the_first_byte(app, client, fakes, acct, ledger_clean):
    fakes.cheap.mode = "503"
    r = chat(client, acct, model="m-small", max_tokens=100, stream=True)
    assert r.headers["X-Chat-Provider"] == "pricey" and r.headers["X-Chat-Attempts"] == "2"
    assert _events(r)[-2]["usage"]["cost_micros"] == 600
    assert figures(app, acct.id)["balance"] == START - 600
    ledger_clean()


def test_streaming_without_upstream_usage_is_a_flagged_estimate(app, client, fakes, acct, ledger_clean):
    r = chat(client, acct, model="m-nousage", stream=True)
    final = _events(r)[-2]
    # prompt: the gateway estimate (10); completion: ceil(len("Hello from nousage") / 4) = 5
    assert final["usage"]["estimated"] is True
    assert (final["usage"]["prompt_tokens"], final["usage"]["completion_tokens"]) == (10, 5)
    assert final["usage"]["cost_micros"] == 10 * 2 + 5 * 4
    r = chat(client, acct, model="m-nousage")
    assert r.get_json()["usage"]["estimated"] is True and r.get_json()["usage"]["cost_micros"] == 40
    assert figures(app, acct.id)["balance"] == START - 80
    ledger_clean()


@pytest.mark.parametrize("model, cut, cost", [
    # OpenAI-shaped upstream: the role chunk and "Hello", then the connection closes (no
    # finish_reason, no [DONE]); estimate: prompt 10 + ceil(5 / 4) = 2 at cheap: 10×1 + 2×2
    ("m-small", 2, 14),
    # Anthropic upstream: message_start, content_block_start and "Hello", no message_delta /
    # message_stop; message_start counted the prompt (20 input tokens, not the Claude
    # estimator's 12), the output is estimated: 20×4 + 2×20 at m-claude's prices
    ("m-claude", 3, 120),
])
def test_upstream_stream_ending_early_is_an_interruption_not_a_finish(app, client, fakes, acct, ledger_clean,
                                                                      model, cut, cost):
    """A close-delimited upstream stream that simply ends mid-answer (no finish, no [DONE]
    or message_stop) is a broken stream: the client gets the error event and no finish_reason
    that would pass the truncated answer off as complete; it is charged what was generated."""
    fakes.cheap.stream_cut = fakes.claude.stream_cut = cut
    r = chat(client, acct, model=model, max_tokens=64, stream=True)
    assert r.status_code == 200
    events = _events(r)
    assert events[-1] == b"[DONE]"
    assert events[-3]["error"]["code"] == "provider_error", events
    assert not [c for c in events[:-3] if any(ch.get("finish_reason") for ch in c["choices"])]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in events[:-3]) == "Hello"
    assert events[-2]["usage"]["estimated"] is True and events[-2]["usage"]["cost_micros"] == cost
    with app.app_context():
        row = db.session.execute(select(ChatCompletion)).scalar_one()
        assert (row.status, row.cost_micros) == ("settled", cost) and row.error.startswith("stream interrupted")
    assert figures(app, acct.id)["balance"] == START - cost
    ledger_clean()


def test_upstream_stream_ending_before_its_first_event_fails_over(app, client, fakes, acct, ledger_clean):
    fakes.cheap.stream_cut = 0  # the cheap provider answers 200 and closes: nothing was sent yet
    r = chat(client, acct, model="m-small", max_tokens=100, stream=True)
    assert r.headers["X-Chat-Provider"] == "pricey" and r.headers["X-Chat-Attempts"] == "2"
    assert _events(r)[-2]["usage"]["cost_micros"] == 600
    ledger_clean()


@pytest.mark.parametrize("model, usage_extra, prompt, cost", [
    # OpenAI-shaped upstream, no usage before the end: estimate, prompt 10 + ceil(len("Hello")
    # / 4) = 2 completion tokens at cheap: 10×1 + 2×2
    ("m-small", {}, 10, 14),
    # Anthropic counts the prompt in its first event (message_start: input tokens, cache reads
    # and writes) and bills it whether or not the answer finishes: the cut stream is charged
    # that prompt (it was the gateway's estimate at the full input price: a cached prompt
    # overcharged, cache reads cost a tenth; an image-heavy one undercharged) and the
    # estimated output: 20 input + 1000 cache-read tokens, 20×4 + 1000×0.4 = 480, + 2 × 20
    ("m-claude", {"cache_read_input_tokens": 1000}, 1020, 520),
], ids=["openai", "anthropic-counted-prompt"])
def test_client_disconnect_is_charged_for_what_was_generated(app, client, fakes, acct, ledger_clean,
                                                             model, usage_extra, prompt, cost):
    fakes.claude.usage_extra = usage_extra
    r = client.post("/v1/chat/completions", json={"model": model, "messages": MSGS, "stream": True,
                                                  "max_tokens": 100},
                    headers={"Authorization": f"Bearer {acct.key}"}, buffered=False)
    it = iter(r.response)
    assert b'"role":"assistant"' in next(it)
    assert b'"Hello"' in next(it)
    r.close()  # the client goes away after "Hello"
    with app.app_context():
        row = db.session.execute(select(ChatCompletion)).scalar_one()
        assert (row.status, row.cost_micros, row.usage_estimated) == ("settled", cost, True)
        assert (row.prompt_tokens, row.completion_tokens, row.error) == (prompt, 2, "client disconnected")
    assert figures(app, acct.id)["balance"] == START - cost
    ledger_clean()


_TOOLS = [{"type": "function", "function": {"name": "f"}}]
_CALL = {"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


@pytest.mark.parametrize("extra", [
    {"stop": 5},
    {"tools": _TOOLS, "tool_choice": {"type": "function", "function": "f"}},
    {"messages": [{"role": "system", "content": [{"type": "text", "text": 5}]}, *MSGS]},
    {"messages": [*MSGS, _CALL, {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": 5}]}]},
], ids=["stop-int", "tool_choice-function-str", "system-text-int", "tool-text-int"])
def test_odd_schema_valid_fields_reach_an_anthropic_provider_without_a_server_error(app, client, fakes, acct,
                                                                                  ledger_clean, extra):
    """Fields the document leaves open (``stop``, ``tool_choice``, content parts' values) are
    the provider's to judge: translating them for an Anthropic upstream must not fail with
    500 (it did: ``list(5)``, ``"f".get``, ``" ".join`` of a number; an image URL that is not
    a string: tests/services/test_chat_catalog.py)."""
    r = chat(client, acct, model="m-claude", max_tokens=64, **extra)
    assert r.status_code == 200, r.get_json()
    assert fakes.claude.calls == 1
    ledger_clean()


def test_anthropic_provider_translated_both_ways(app, client, fakes, acct, ledger_clean):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    r = chat(client, acct, model="m-claude", messages=messages, max_tokens=64, temperature=0.2)
    body = r.get_json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello from claude"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["cost_micros"] == 20 * 4 + 10 * 20  # 280
    sent, headers = fakes.claude.bodies[0], fakes.claude.headers[0]
    assert sent == {"model": "claude-test", "max_tokens": 64, "system": "Be brief.", "temperature": 0.2,
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]}
    assert headers["x-api-key"] == "sk-ant-test" and headers["anthropic-version"] == "2023-06-01"
    tools = [{"type": "function", "function": {"name": "weather", "description": "w",
                                               "parameters": {"type": "object", "properties": {}}}}]
    r = chat(client, acct, model="m-claude", tools=tools, tool_choice="required", max_tokens=64)
    msg = r.get_json()["choices"][0]
    assert msg["finish_reason"] == "tool_calls"
    assert msg["message"]["tool_calls"] == [{"id": "toolu_1", "type": "function", "function": {
        "name": "weather", "arguments": '{"city":"Paris"}'}}]
    assert fakes.claude.bodies[1]["tools"] == [{"name": "weather", "description": "w",
                                                "input_schema": {"type": "object", "properties": {}}}]
    assert fakes.claude.bodies[1]["tool_choice"] == {"type": "any"}
    r = chat(client, acct, model="m-claude", stream=True, max_tokens=64)
    events = _events(r)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in events[:-1] if c["choices"])
    assert text == "Hello from claude" and events[-2]["usage"]["cost_micros"] == 280
    assert events[-2]["usage"]["estimated"] is False
    assert figures(app, acct.id)["balance"] == START - 3 * 280
    ledger_clean()


def test_tool_choice_none_keeps_the_tools_for_an_anthropic_provider(app, client, fakes, acct, ledger_clean):
    """OpenAI's ``tool_choice: "none"`` (and the Messages API's ``{type: none}``) is Anthropic's
    ``tool_choice: {type: none}`` with the tools still sent: a conversation that already holds
    tool calls and results must define its tools, which Anthropic requires of any request
    with ``tool_use`` / ``tool_result`` blocks. The tools used to be dropped instead, so
    "now answer without calling a tool" after a tool round was refused by the provider (400)."""
    tools = [{"type": "function", "function": {"name": "weather", "description": "w",
                                               "parameters": {"type": "object", "properties": {}}}}]
    history = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}]
    r = chat(client, acct, model="m-claude", messages=history, tools=tools, tool_choice="none", max_tokens=64)
    assert r.status_code == 200, r.get_json()
    sent = fakes.claude.bodies[0]
    assert sent["tool_choice"] == {"type": "none"}
    assert sent["tools"] == [{"name": "weather", "description": "w",
                              "input_schema": {"type": "object", "properties": {}}}]
    r = client.post("/v1/messages", headers={"x-api-key": acct.key}, json={
        "model": "m-claude", "max_tokens": 64, "tool_choice": {"type": "none"},
        "tools": [{"name": "weather", "input_schema": {"type": "object", "properties": {}}}],
        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.get_json()
    assert fakes.claude.bodies[1]["tool_choice"] == {"type": "none"} and fakes.claude.bodies[1]["tools"]
    ledger_clean()


@pytest.mark.parametrize("tool_choice, sent", [
    (None, {"type": "auto", "disable_parallel_tool_use": True}),
    ("required", {"type": "any", "disable_parallel_tool_use": True}),
    ({"type": "function", "function": {"name": "weather"}},
     {"type": "tool", "name": "weather", "disable_parallel_tool_use": True}),
])
def test_parallel_tool_calls_false_reaches_an_anthropic_provider(app, client, fakes, acct, ledger_clean,
                                                                tool_choice, sent):
    """OpenAI's ``parallel_tool_calls: false`` (at most one tool call per answer) is
    Anthropic's ``disable_parallel_tool_use`` on the tool choice; it was dropped, so code
    written to handle one call got several from a Claude model."""
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    extra = {} if tool_choice is None else {"tool_choice": tool_choice}
    r = chat(client, acct, model="m-claude", tools=tools, parallel_tool_calls=False, max_tokens=64, **extra)
    assert r.status_code == 200, r.get_json()
    assert fakes.claude.bodies[0]["tool_choice"] == sent
    ledger_clean()


def test_messages_api_disable_parallel_tool_use_reaches_the_provider(app, client, fakes, acct, ledger_clean):
    """The Messages API's ``tool_choice.disable_parallel_tool_use`` is OpenAI's
    ``parallel_tool_calls: false`` for an OpenAI-shaped provider, and stays on the tool
    choice for an Anthropic one; it was ignored."""
    for model in ("m-big", "m-claude"):
        r = client.post("/v1/messages", headers={"x-api-key": acct.key}, json={
            "model": model, "max_tokens": 64, "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
            "tools": [{"name": "weather", "input_schema": {"type": "object", "properties": {}}}],
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.get_json()
    assert fakes.pricey.bodies[0]["parallel_tool_calls"] is False
    assert fakes.claude.bodies[0]["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    ledger_clean()


def test_test_mode_uses_the_sandbox_and_moves_no_money(app, client, fakes, acct, ledger_clean):
    r = chat(client, acct, key=acct.test_key, model="m-small")
    body = r.get_json()
    assert r.status_code == 200 and body["provider"] == "demo_llm"
    assert body["choices"][0]["message"]["content"] == "Echo: hello there"
    # demo counts words: prompt 3 + 2, completion 3; priced at m-small's primary (3 / 6)
    assert body["usage"]["cost_micros"] == 5 * 3 + 3 * 6
    assert fakes.cheap.calls == fakes.pricey.calls == 0
    with app.app_context():
        assert db.session.execute(select(LedgerTransaction.kind)
                                  .where(LedgerTransaction.account_id == acct.id)).all() == []
        assert db.session.execute(select(ChatCompletion.status)).scalar_one() == "sandbox"
        start, end = usage.billing_period()
        assert usage.totals(acct.id, start, end, mode="test")["calls"] == 1
    assert figures(app, acct.id)["balance"] == START
    ledger_clean()


def test_the_demo_llm_answers_a_request_it_cannot_read_with_400_not_a_dropped_connection(app, client, fakes, acct):
    """The demo LLM (the sandbox and the embedded default's provider) dropped the connection
    on a schema-valid body it could not read (a text part whose text is not a string): the
    gateway saw a connection failure, tried again and answered 502. It answers 400 now, as
    a provider does, which the gateway returns as the provider's rejection."""
    r = chat(client, acct, key=acct.test_key, model="m-small",
             messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}])
    assert r.status_code == 400, r.get_json()
    err = r.get_json()["error"]
    assert err["code"] == "invalid_request" and "provider rejected the request" in err["message"]
    assert r.headers["X-Chat-Attempts"] == "1"


def test_models_listing(client, fakes, acct):
    r = client.get("/v1/models", headers=acct.headers)
    assert r.status_code == 200
    body = r.get_json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["auto", "m-small", "m-big", "m-claude", "m-nousage"]
    small = body["data"][1]
    assert client.get("/v1/models/m-small", headers=acct.headers).get_json() == small
    r = client.get("/v1/models/m-offline", headers=acct.headers)
    assert r.status_code == 404 and r.get_json()["error"]["code"] == "model_not_found"
    assert small["owned_by"] == "pricey,cheap" and small["context_window"] == 1000
    assert small["pricing"] == {"input_usd_per_mtok": "1", "output_usd_per_mtok": "2"}


def test_models_take_anthropics_x_api_key_as_messages_does(client, fakes, acct):
    """The anthropic SDK lists and retrieves models with its ``x-api-key`` header (as it calls
    /v1/messages); /v1/models answered it 401 until 2026-11-29."""
    listed = client.get("/v1/models", headers=acct.headers).get_json()
    r = client.get("/v1/models", headers={"x-api-key": acct.key})
    assert r.status_code == 200 and r.get_json() == listed
    r = client.get("/v1/models/m-small", headers={"x-api-key": acct.key})
    assert r.status_code == 200 and r.get_json()["id"] == "m-small"
    r = client.get("/v1/models", headers={"x-api-key": "svc_live_nope"})
    assert r.status_code == 401 and r.get_json()["error"]["code"] == "unauthorized"


def test_the_anthropic_sdk_lists_models_in_anthropics_shape(app, client, fakes, acct):
    """With ``anthropic-version`` (sent by Anthropic's clients on every request) the model
    routes answer Anthropic's shape, paged as its API pages; the anthropic SDK's
    ``models.list`` pages through them all and ``models.retrieve`` reads one. Until
    2026-11-29 they answered OpenAI's list only: the SDK's models had no ``type``,
    ``display_name`` or ``created_at``, ``has_more`` was missing and ``capabilities`` was a
    list where Anthropic's is an object."""
    import anthropic
    import httpx2 as httpx

    sdk = anthropic.Anthropic(api_key=acct.key, base_url="http://localhost", max_retries=0,
                              http_client=httpx.Client(transport=httpx.WSGITransport(app=app)))
    openai_ids = [m["id"] for m in client.get("/v1/models", headers=acct.headers).get_json()["data"]]
    models = list(sdk.models.list(limit=2))  # the SDK follows has_more / last_id page by page
    assert [m.id for m in models] == openai_ids
    small = next(m for m in models if m.id == "m-small")
    assert (small.type, small.display_name, small.max_input_tokens, small.lifecycle) == \
        ("model", "m-small", 1000, "active")
    assert small.created_at.year == 1970 and small.model_extra in (None, {})
    assert sdk.models.retrieve("m-small").to_dict() == small.to_dict()
    page = client.get("/v1/models?limit=2", headers={"x-api-key": acct.key, "anthropic-version": "2023-06-01"})
    body = page.get_json()
    assert (body["has_more"], body["first_id"], body["last_id"]) == (True, "auto", "m-small")
    before = client.get("/v1/models?before_id=m-big", headers={"x-api-key": acct.key,
                                                             "anthropic-version": "2023-06-01"}).get_json()
    assert [m["id"] for m in before["data"]] == ["auto", "m-small"] and before["has_more"] is False
    r = client.get("/v1/models?after_id=nope", headers={"x-api-key": acct.key, "anthropic-version": "2023-06-01"})
    assert r.status_code == 404 and r.get_json()["error"]["code"] == "model_not_found"  # as /v1/models/{id}
    assert "after_id" in r.get_json()["error"]["message"]
    r = client.get("/v1/models?limit=0", headers={"x-api-key": acct.key, "anthropic-version": "2023-06-01"})
    assert r.status_code in (400, 422)
    # without the header: OpenAI's list, whatever the query says
    assert [m["id"] for m in client.get("/v1/models?limit=1", headers=acct.headers).get_json()["data"]] == openai_ids


def test_chat_host_matching(app, client, monkeypatch, fakes, acct):
    monkeypatch.setitem(app.config, "CHAT_HOST", "chat.example.test")
    r = client.post("/v1/chat/completions", json={"model": "auto", "messages": MSGS},
                    headers=acct.headers, base_url="http://api.example.test")
    # off the chat host a chat path is the gateway's plain 404, in the gateway's shape
    assert r.status_code == 404 and r.get_json()["error"] == "not_found"
    assert client.get("/v1/models", headers=acct.headers,
                      base_url="http://api.example.test").status_code == 404
    r = client.post("/v1/chat/completions", json={"model": "auto", "messages": MSGS},
                    headers=acct.headers, base_url="http://chat.example.test:8443")
    assert r.status_code == 200
    # the fully qualified spelling (trailing dot) is the same host (before: 404)
    for host in ("http://chat.example.test.", "http://CHAT.example.test.:8443"):
        r = client.post("/v1/chat/completions", json={"model": "auto", "messages": MSGS},
                        headers=acct.headers, base_url=host)
        assert r.status_code == 200, (host, r.get_json())
    assert client.get("/v1/models", headers=acct.headers, base_url="http://api.example.test.").status_code == 404


def test_chat_cors(app, client, monkeypatch, fakes, acct, ledger_clean):
    """Issue 39 item 6: CHAT_CORS_ORIGINS (default none) on the chat host — preflight,
    answers (through the thin entry's hand-over to Flask), errors and streams."""
    origin = {"Origin": "https://app.example"}
    pre_headers = {**origin, "Access-Control-Request-Method": "POST",
                   "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}
    pre = client.options("/v1/chat/completions", headers=pre_headers)
    assert "Access-Control-Allow-Origin" not in pre.headers  # default: no browser origin
    r = chat(client, acct, model="m-small", max_tokens=10)
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers

    monkeypatch.setitem(app.config, "CHAT_CORS_ORIGINS", "https://app.example, https://other.example")
    pre = client.options("/v1/chat/completions", headers=pre_headers)
    assert pre.status_code in (200, 204)
    assert pre.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert pre.headers["Access-Control-Allow-Headers"] == "authorization, content-type, x-stainless-os"
    assert int(pre.headers["Access-Control-Max-Age"]) > 0 and "Origin" in pre.headers["Vary"]

    r = client.post("/v1/chat/completions", json={"model": "m-small", "messages": MSGS, "max_tokens": 10},
                    headers={**acct.headers, **origin})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "https://app.example"
    exposed = r.headers["Access-Control-Expose-Headers"]
    assert all(h in exposed for h in ("X-Request-Id", "X-Gateway-Cost-Micros", "X-Gateway-Savings-Pct",
                                      "X-Gateway-Overhead-Ms"))
    assert "Origin" in r.headers["Vary"]
    bad = client.post("/v1/chat/completions", json={"model": "m-small", "messages": MSGS}, headers=origin)
    assert bad.status_code == 401 and bad.headers["Access-Control-Allow-Origin"] == "https://app.example"
    models = client.get("/v1/models", headers={**acct.headers, **origin})
    assert models.headers["Access-Control-Allow-Origin"] == "https://app.example"
    evil = client.options("/v1/chat/completions", headers={**pre_headers, "Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in evil.headers
    ledger_clean()


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": "m-small", "messages": MSGS}),
    ("/v1/messages", {"model": "m-small", "max_tokens": 50, "messages": MSGS}),
])
def test_who_acted_is_recorded_on_both_chat_apis(app, client, acct, fakes, path, body):  # noqa: F811
    """The completion row and its hold record the credential that acted (`actor`) apart
    from the account that pays; /v1/messages left it empty."""
    r = client.post(path, json=body, headers={"Authorization": f"Bearer {acct.key}"})
    assert r.status_code == 200, r.get_json()
    with app.app_context():
        key_id = db.session.execute(select(ChatCompletion.actor)).scalars().all()
        txn = db.session.execute(select(LedgerTransaction.actor, LedgerTransaction.account_id)
                                 .where(LedgerTransaction.kind == "chat_hold")).one()
        db.session.remove()
    assert len(key_id) == 1 and key_id[0] and key_id[0].startswith("key_")
    assert tuple(txn) == (key_id[0], acct.id)


def test_a_stream_never_started_keeps_no_heartbeat_and_its_hold_is_swept(app, fakes, acct, ledger_clean):
    """A stream's body that is never iterated (the response was dropped before its first
    byte: an error after the view, a worker giving up) must not keep its hold alive. Its
    heartbeat started with the completion, before the body ran, and extended the hold
    until the process restarted (issue 42 item 13); it now starts with the body, so the
    stale-hold sweep gives the hold back."""
    import threading
    import time

    from app.services.chat import completions
    from app.services.money import holds

    with app.test_request_context():
        result = completions.create_completion(acct.id, "live", {
            "model": "m-small", "messages": MSGS, "stream": True, "max_tokens": 100})
        completion = result.headers["X-Chat-Completion-Id"]
        assert result.events is not None  # never called: the body never runs
        assert not [t for t in threading.enumerate() if t.name == f"hold-heartbeat-{completion}"]
        db.session.remove()
    assert figures(app, acct.id)["held"] > 0
    time.sleep(0.2)  # past the cut-off below: the hold gave no sign of life since
    with app.app_context():
        released = holds.release_stale_holds(older_than_seconds=0.1)
        db.session.remove()
    assert released == 1
    f = figures(app, acct.id)
    assert f["held"] == 0 and f["balance"] == START
    ledger_clean()


def test_a_failed_tool_result_reaches_the_provider_as_failed(app, client, fakes, acct, ledger_clean):
    """A Messages API ``tool_result`` with ``is_error: true`` tells the model the tool
    failed. It was dropped in the translation (Messages → the internal OpenAI body →
    Anthropic), so a Claude provider read the error text as a successful result. Now an
    Anthropic provider's ``tool_result`` block carries it, an OpenAI-compatible provider
    (whose tool messages have no such field) is never sent it, and a chat-completions
    caller's tool message may say the same (docs/chat.md)."""
    tools = [{"name": "weather", "input_schema": {"type": "object", "properties": {}}}]
    turns = [{"role": "user", "content": "weather?"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}]},
             {"role": "user", "content": [
                 {"type": "tool_result", "tool_use_id": "toolu_1", "content": "service down", "is_error": True},
                 {"type": "text", "text": "try again?"}]}]
    for model in ("m-claude", "m-big"):
        r = client.post("/v1/messages", headers={"x-api-key": acct.key},
                        json={"model": model, "max_tokens": 64, "tools": tools, "messages": turns})
        assert r.status_code == 200, r.get_json()
    result = fakes.claude.bodies[0]["messages"][2]["content"][0]
    assert result == {"type": "tool_result", "tool_use_id": "toolu_1", "content": "service down", "is_error": True}
    sent = fakes.pricey.bodies[0]["messages"]
    assert sent[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "service down"}
    # a tool result that did not fail says nothing (as Anthropic's default)
    turns[2]["content"][0]["is_error"] = False
    r = client.post("/v1/messages", headers={"x-api-key": acct.key},
                    json={"model": "m-claude", "max_tokens": 64, "tools": tools, "messages": turns})
    assert r.status_code == 200 and "is_error" not in fakes.claude.bodies[1]["messages"][2]["content"][0]
    # the same from /v1/chat/completions: a tool message's is_error
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "toolu_1", "content": "service down", "is_error": True}]
    oa_tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    for model in ("m-claude", "m-big"):
        r = chat(client, acct, model=model, messages=history, tools=oa_tools, max_tokens=64)
        assert r.status_code == 200, r.get_json()
    assert fakes.claude.bodies[2]["messages"][2]["content"][0]["is_error"] is True
    assert "is_error" not in fakes.pricey.bodies[1]["messages"][2]
    ledger_clean()


@pytest.mark.parametrize("path, body, param", [
    ("/v1/messages", {"model": "m-claude", "max_tokens": 64, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x", "is_error": "yes"}]}]},
     "messages.0.content.0.is_error"),
    ("/v1/chat/completions", {"model": "m-claude", "max_tokens": 64, "messages": [
        {"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "t", "content": "x", "is_error": 1}]},
     "messages.1.is_error"),
])
def test_a_tool_results_is_error_must_be_a_boolean(app, client, fakes, acct, path, body, param):
    r = client.post(path, headers={"x-api-key": acct.key, "Authorization": f"Bearer {acct.key}"}, json=body)
    assert r.status_code == 400, r.get_json()
    error = r.get_json()["error"]  # Anthropic's error names no param: its message does
    assert error["message"] == f"{param}: must be a boolean." and error.get("param", param) == param
    assert fakes.claude.calls == 0


def test_several_choices_are_never_answered_with_one(app, client, fakes, acct, ledger_clean):
    """``n: 2`` asks for two choices. Anthropic's Messages API has no ``n``: an Anthropic
    provider answered one choice and the gateway returned it as the whole answer, so a
    client reading ``choices[1]`` failed after being charged. Such offers now serve only
    ``n: 1``: a model served by Anthropic providers alone is 400 (param ``n``, nothing
    held or called), and ``n: 1`` still reaches them."""
    r = chat(client, acct, model="m-claude", n=2, max_tokens=64)
    assert r.status_code == 400, r.get_json()
    error = r.get_json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("no_matching_model", "n", "invalid_request_error")
    assert "n > 1" in error["message"] and "m-claude" in error["message"]
    assert fakes.claude.calls == 0 and figures(app, acct.id)["balance"] == START
    r = chat(client, acct, model="m-claude", n=1, max_tokens=64)
    assert r.status_code == 200 and len(r.get_json()["choices"]) == 1
    r = chat(client, acct, model="m-small", n=2, max_tokens=64)  # OpenAI-compatible providers take n
    assert r.status_code == 200 and fakes.cheap.bodies[0]["n"] == 2
    ledger_clean()


@pytest.mark.parametrize("model", ["m-small", "m-claude"])
def test_a_stream_without_include_usage_has_no_chunk_without_choices(app, client, fakes, acct, ledger_clean, model):
    """OpenAI sends the usage chunk (``choices: []``) only when ``stream_options.include_usage``
    asks for it, and clients written for that read ``chunk.choices[0]`` on every chunk: the
    gateway sent it always, so they failed (IndexError) on its last chunk. Without
    ``include_usage`` the usage with the cost now rides on the chunk that finishes the
    answer, the last before ``[DONE]``; with it, as OpenAI's."""
    r = chat(client, acct, model=model, max_tokens=64, stream=True)
    events = _events(r)
    assert events[-1] == b"[DONE]"
    chunks = events[:-1]
    assert all(c["choices"] for c in chunks), chunks[-1]
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "stop" and last["usage"]["cost_micros"] > 0
    assert [c for c in chunks if "usage" in c] == [last]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == f"Hello from {'cheap' if model == 'm-small' else 'claude'}"
    assert figures(app, acct.id)["balance"] == START - last["usage"]["cost_micros"]
    r = chat(client, acct, model=model, max_tokens=64, stream=True, stream_options={"include_usage": False})
    assert all(c["choices"] for c in _events(r)[:-1])
    ledger_clean()


def test_a_stream_of_n_choices_keeps_each_choices_text_in_order(app, client, fakes, acct, ledger_clean):
    """Without ``include_usage`` the chunk that finishes a choice was held back to the end
    while later chunks went ahead of it: a provider that packs choice 0's finish with choice
    1's first words (the fake does) had those words reach the client after the rest of
    choice 1's text. Now a held chunk goes out as soon as another comes; only the last one
    that finishes a choice waits for the usage."""
    r = chat(client, acct, model="m-small", n=2, max_tokens=64, stream=True)
    events = _events(r)
    assert events[-1] == b"[DONE]"
    chunks = events[:-1]
    texts = {0: "", 1: ""}
    for c in chunks:
        for choice in c["choices"]:
            texts[choice["index"]] += choice["delta"].get("content") or ""
    assert texts == {0: "Hello from cheap", 1: "Hello from cheap"}
    assert [c for c in chunks if "usage" in c] == [chunks[-1]] and all(c["choices"] for c in chunks)
    ledger_clean()


def test_the_demo_llm_answers_n_choices_and_honours_stop(app, client, fakes, acct, ledger_clean):
    """The demo LLM (the sandbox of test keys, the embedded default's provider) ignored
    ``n`` and ``stop``: ``n: 2`` got one choice and a stop sequence cut nothing, so code
    tried against it broke on a real provider. It answers ``n`` choices (each counted) and
    ends a reply before its first stop sequence."""
    r = chat(client, acct, key=acct.test_key, model="m-small", n=2, stop=["there"])
    body = r.get_json()
    assert r.status_code == 200, body
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert {c["message"]["content"] for c in body["choices"]} == {"Echo: hello"}
    assert {c["finish_reason"] for c in body["choices"]} == {"stop"}
    assert body["usage"]["completion_tokens"] == 2 * 2  # two words per choice
    r = chat(client, acct, key=acct.test_key, model="m-small", n=2, stop="hello", stream=True)
    chunks = _events(r)[:-1]
    text = {i: "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                       if c["choices"] and c["choices"][0]["index"] == i) for i in (0, 1)}
    assert text == {0: "Echo:", 1: "Echo:"}
    assert chunks[-1]["usage"]["completion_tokens"] == 2


def test_every_anthropic_style_error_carries_the_request_id_header(client, fakes, acct):
    """The ``anthropic`` SDK reads the request id of an error from the ``request-id`` header
    (``e.request_id``). Errors in Anthropic's shape from no route (e.g. its SDK's
    ``messages.batches``, ``POST /v1/messages/batches``, which the gateway does not serve)
    came without it: only the Messages route set it."""
    r = client.post("/v1/messages/batches", headers={"x-api-key": acct.key},
                    json={"requests": []})
    assert r.status_code == 404 and r.get_json()["type"] == "error"
    assert r.headers["request-id"] == r.get_json()["request_id"] == r.headers["X-Request-Id"]
    r = client.post("/v1/chat/nope", headers=acct.headers, json={})  # OpenAI's shape: not Anthropic's header
    assert r.status_code == 404 and "request-id" not in r.headers


def test_openai_paths_the_chat_host_does_not_serve_answer_in_openais_shape(app, client, monkeypatch, fakes, acct):
    """An OpenAI client pointed at the chat host also calls what the gateway does not serve
    (``embeddings.create``, ``responses.create`` …); their 404 was in the gateway's shape,
    so the openai SDK showed the raw body, ``e.code`` None, and werkzeug's "check your
    spelling". It is OpenAI's shape now, naming what the chat host serves; the module
    gateway's calls under ``/v1/module/`` and every path off the chat host keep the gateway's."""
    monkeypatch.setitem(app.config, "CHAT_HOST", "localhost")  # the test client's host
    for path in ("/v1/embeddings", "/v1/responses", "/v1/audio/speech"):
        r = client.post(path, headers=acct.headers, json={"model": "auto", "input": "hi"})
        err = r.get_json()["error"]
        assert r.status_code == 404 and (err["type"], err["code"]) == ("not_found_error", "not_found"), r.get_json()
        assert err["message"].startswith(f"{path} is not served here") and "POST /v1/chat/completions" in err["message"]
    r = client.post("/v1/module", headers=acct.headers, json={})
    assert r.status_code == 404 and r.get_json()["error"] == "not_found"
    r = client.post("/v1/module/nope/call", headers=acct.headers, json={"action": "x"})
    assert r.status_code == 404 and isinstance(r.get_json()["error"], str)
    monkeypatch.setitem(app.config, "CHAT_HOST", "chat.example.test")
    r = client.post("/v1/embeddings", headers=acct.headers, json={}, base_url="http://api.example.test")
    assert r.status_code == 404 and r.get_json()["error"] == "not_found"
    r = client.post("/v1/embeddings", headers=acct.headers, json={}, base_url="http://chat.example.test")
    assert r.status_code == 404 and r.get_json()["error"]["type"] == "not_found_error"


def test_prompt_cache_breakpoints_reach_an_anthropic_provider(app, client, fakes, acct, ledger_clean):
    """Anthropic caches a prompt up to each ``cache_control`` breakpoint (system, tool,
    text, image and tool_result blocks); the translation dropped every one, so a Claude
    conversation through ``/v1/messages`` was never cached and paid the full input price
    each turn. They now reach an Anthropic provider where the caller put them (from
    ``/v1/chat/completions`` too, on content parts, tools and tool messages: OpenRouter's
    convention), and never an OpenAI-compatible one (strict servers refuse the field)."""
    eph = {"type": "ephemeral"}
    tools = [{"name": "weather", "input_schema": {"type": "object", "properties": {}}, "cache_control": eph}]
    turns = [{"role": "user", "content": [{"type": "text", "text": "weather?", "cache_control": eph}]},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}]},
             {"role": "user", "content": [
                 {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny", "cache_control": eph}]}]
    system = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Long rules.", "cache_control": eph}]
    for model in ("m-claude", "m-big"):
        r = client.post("/v1/messages", headers={"x-api-key": acct.key}, json={
            "model": model, "max_tokens": 64, "system": system, "tools": tools, "messages": turns})
        assert r.status_code == 200, r.get_json()
    sent = fakes.claude.bodies[0]
    assert sent["system"] == system
    assert sent["tools"] == [{"name": "weather", "description": "", "input_schema": {"type": "object", "properties": {}},
                              "cache_control": eph}]
    assert sent["messages"][0]["content"] == [{"type": "text", "text": "weather?", "cache_control": eph}]
    assert sent["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny",
                                               "cache_control": eph}]
    assert "cache_control" not in orjson.dumps(fakes.pricey.bodies[0]).decode()
    # without breakpoints the system prompt stays a string
    r = client.post("/v1/messages", headers={"x-api-key": acct.key}, json={
        "model": "m-claude", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}], "messages": turns[:1]})
    assert r.status_code == 200 and fakes.claude.bodies[1]["system"] == "Be brief."
    # chat completions: a content part's breakpoint
    r = chat(client, acct, model="m-claude", max_tokens=64, messages=[
        {"role": "system", "content": [{"type": "text", "text": "Rules.", "cache_control": eph}]},
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": eph}]}])
    assert r.status_code == 200, r.get_json()
    assert fakes.claude.bodies[2]["system"] == [{"type": "text", "text": "Rules.", "cache_control": eph}]
    assert fakes.claude.bodies[2]["messages"][0]["content"] == [{"type": "text", "text": "hi", "cache_control": eph}]
    ledger_clean()


def test_a_one_hour_cache_write_is_priced_and_reported_as_anthropic_bills_it(app, client, fakes, acct,
                                                                            ledger_clean):
    """Anthropic bills writes to its 1-hour cache (``cache_control.ttl: "1h"``) at 2× the
    input price, 5-minute writes at 1.25×. The ``ttl`` was dropped, so the caller could not
    have the 1-hour cache at all and every write was priced as a 5-minute one. The ``ttl``
    now goes on; the writes Anthropic reports by duration (``usage.cache_creation``) are
    priced apart (m-claude: input 4, 5-minute write 5, 1-hour write 2 × 4 = 8), reported in
    Anthropic's names on ``/v1/messages`` (streams too) and as ``cache_write_1h_tokens`` on
    chat completions, and the hold covers writing the whole prompt to the 1-hour cache."""
    hour = {"type": "ephemeral", "ttl": "1h"}
    fakes.claude.usage_extra = {"cache_creation_input_tokens": 1000, "cache_creation": {
        "ephemeral_5m_input_tokens": 400, "ephemeral_1h_input_tokens": 600}}
    body = {"model": "m-claude", "max_tokens": 1000,
            "system": [{"type": "text", "text": "Long rules.", "cache_control": hour}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": "5m"}}]}]}
    r = client.post("/v1/messages", headers={"x-api-key": acct.key}, json=body)
    assert r.status_code == 200, r.get_json()
    sent = fakes.claude.bodies[0]
    assert sent["system"] == [{"type": "text", "text": "Long rules.", "cache_control": hour}]
    assert sent["messages"][0]["content"] == [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]
    usage = r.get_json()["usage"]
    cost = 20 * 4 + 400 * 5 + 600 * 8 + 10 * 20  # it was 20 × 4 + 1000 × 5 + 10 × 20
    assert (usage["input_tokens"], usage["cache_creation_input_tokens"], usage["cost_micros"]) == (20, 1000, cost)
    assert usage["cache_creation"] == {"ephemeral_5m_input_tokens": 400, "ephemeral_1h_input_tokens": 600}
    r = client.post("/v1/messages", headers={"x-api-key": acct.key}, json={**body, "stream": True})
    events = [orjson.loads(b.split(b"data: ", 1)[1]) for b in r.get_data().split(b"\n\n") if b"data: " in b]
    start = next(e for e in events if e["type"] == "message_start")["message"]["usage"]
    final = next(e for e in events if e["type"] == "message_delta")["usage"]
    assert start["cache_creation"] == final["cache_creation"] == usage["cache_creation"]
    assert final["cost_micros"] == cost
    r = chat(client, acct, model="m-claude", max_tokens=1000, messages=[
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": hour}]}])
    assert r.get_json()["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 0, "cache_write_tokens": 1000, "cache_write_1h_tokens": 600}
    assert r.get_json()["usage"]["cost_micros"] == cost
    # the hold covers the whole prompt written to the 1-hour cache (8), not the 5-minute one (5)
    fakes.claude.usage_extra = {}
    text = "a long system prompt " * 200
    for ttl in ("5m", "1h"):
        r = chat(client, acct, model="m-claude", max_tokens=100, messages=[
            {"role": "system", "content": [{"type": "text", "text": text,
                                            "cache_control": {"type": "ephemeral", "ttl": ttl}}]},
            {"role": "user", "content": "hi"}])
        assert r.status_code == 200, r.get_json()
    with app.app_context():
        five, one = db.session.execute(select(ChatCompletion.hold_micros).order_by(ChatCompletion.created_at)
                                       ).scalars().all()[-2:]
        db.session.remove()
    prompt = (five - 100 * 20) // 5
    assert prompt > 0 and one == prompt * 8 + 100 * 20
    ledger_clean()


def test_a_matched_stop_sequence_is_reported(app, client, fakes, acct, ledger_clean):
    """Anthropic says which stop sequence ended a message (``stop_reason: "stop_sequence"``,
    ``stop_sequence``); ``/v1/messages`` answered ``end_turn`` and ``null`` even when its
    Anthropic provider said so, so a client could not tell a stop sequence from the end of
    the answer. The provider's word is kept (internally and on ``/v1/chat/completions`` as
    vLLM reports it: the choice's ``stop_reason`` names the sequence), streams included."""
    body = {"model": "m-claude", "max_tokens": 64, "stop_sequences": ["claude"], "messages": MSGS}
    r = client.post("/v1/messages", headers={"x-api-key": acct.key}, json=body)
    msg = r.get_json()
    assert (msg["stop_reason"], msg["stop_sequence"]) == ("stop_sequence", "claude"), msg
    assert msg["content"] == [{"type": "text", "text": "Hello from "}]
    r = client.post("/v1/messages", headers={"x-api-key": acct.key}, json={**body, "stream": True})
    deltas = [orjson.loads(b.split(b"data: ", 1)[1]) for b in r.get_data().split(b"\n\n")
              if b.startswith(b"event: message_delta")]
    assert deltas[0]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "claude"}
    r = chat(client, acct, model="m-claude", max_tokens=64, stop=["claude"])
    choice = r.get_json()["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "claude")
    # an answer that ended by itself names none
    r = client.post("/v1/messages", headers={"x-api-key": acct.key}, json={**body, "stop_sequences": ["zzz"]})
    assert (r.get_json()["stop_reason"], r.get_json()["stop_sequence"]) == ("end_turn", None)
    ledger_clean()


def test_a_stop_reason_that_is_no_requested_sequence_is_no_stop_sequence():
    """Only a sequence the request asked to stop at is reported as one: another upstream's
    ``stop_reason`` (e.g. a proxy's copy of Anthropic's ``end_turn``) is not."""
    from app.services.chat import messages

    body = {"id": "chatcmpl-x", "model": "m", "usage": {"prompt_tokens": 1, "completion_tokens": 1},
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "stop",
                         "stop_reason": "end_turn"}]}
    out = messages.from_openai(body, ("###",))
    assert (out["stop_reason"], out["stop_sequence"]) == ("end_turn", None)
    body["choices"][0]["stop_reason"] = "###"
    out = messages.from_openai(body, ("###",))
    assert (out["stop_reason"], out["stop_sequence"]) == ("stop_sequence", "###")


def test_a_tool_result_may_hold_images(app, client, fakes, acct, ledger_clean):
    """Anthropic's ``tool_result`` content takes image blocks (a screenshot, an image file a
    tool read); ``/v1/messages`` refused them (400), so such a conversation could not go
    through the gateway. An Anthropic provider now gets them in its ``tool_result``; an
    OpenAI-compatible one, whose tool messages take text only, gets the text there and the
    images in a user message right after the tool results (as OpenRouter does)."""
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    tools = [{"name": "screenshot", "input_schema": {"type": "object", "properties": {}}}]
    turns = [{"role": "user", "content": "look"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                           "content": [{"type": "text", "text": "here"}, img]},
                                          {"type": "text", "text": "what is it?"}]}]
    for model in ("m-claude", "m-big"):
        r = client.post("/v1/messages", headers={"x-api-key": acct.key},
                        json={"model": model, "max_tokens": 64, "tools": tools, "messages": turns})
        assert r.status_code == 200, r.get_json()
    assert fakes.claude.bodies[0]["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "here"}, img]},
        {"type": "text", "text": "what is it?"}]
    sent = fakes.pricey.bodies[0]["messages"]
    assert sent[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "here"}
    assert sent[3] == {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
    assert sent[4] == {"role": "user", "content": [{"type": "text", "text": "what is it?"}]}
    # a model without vision is no candidate for it (the image counts, as in a user turn)
    r = client.post("/v1/messages", headers={"x-api-key": acct.key},
                    json={"model": "m-small", "max_tokens": 64, "messages": turns})
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "no_matching_model"
    ledger_clean()


def test_a_hold_with_cache_breakpoints_covers_writing_the_prompt_to_the_cache(app, client, fakes, acct,
                                                                              ledger_clean):
    """A request with cache_control may make an Anthropic provider write the whole prompt to
    its cache, billed at the cache write price (m-claude: 5 against 4 for input). The hold
    was sized at the input price, so such a completion could cost more than was held and
    the charge was capped at the hold (the platform paid the rest)."""
    text = "a long system prompt " * 200
    for mark in ({}, {"cache_control": {"type": "ephemeral"}}):
        r = chat(client, acct, model="m-claude", max_tokens=100, messages=[
            {"role": "system", "content": [{"type": "text", "text": text, **mark}]},
            {"role": "user", "content": "hi"}])
        assert r.status_code == 200, r.get_json()
    with app.app_context():
        plain, marked = db.session.execute(select(ChatCompletion.hold_micros)
                                           .order_by(ChatCompletion.created_at)).scalars().all()
        db.session.remove()
    prompt = (plain - 100 * 20) // 4
    assert prompt > 0 and marked == prompt * 5 + 100 * 20
    ledger_clean()


def test_a_browser_on_the_chat_host_may_read_the_x402_settlement(app, client, monkeypatch, fakes, acct,
                                                                  ledger_clean):
    """A paid completion (and, since 2026-11-29, a 402 whose settlement the facilitator
    refused) carries PAYMENT-RESPONSE (X-PAYMENT-RESPONSE for x402 v1); the chat host's CORS
    list of exposed headers replaced the one the payment set and did not name it, so a
    browser's x402 client could not read whether or how its payment settled."""
    monkeypatch.setitem(app.config, "CHAT_CORS_ORIGINS", "https://app.example")
    r = client.post("/v1/chat/completions", json={"model": "m-small", "messages": MSGS, "max_tokens": 10},
                    headers={**acct.headers, "Origin": "https://app.example"})
    exposed = {h.strip() for h in r.headers["Access-Control-Expose-Headers"].split(",")}
    assert {"PAYMENT-RESPONSE", "X-PAYMENT-RESPONSE", "PAYMENT-REQUIRED"} <= exposed
    ledger_clean()


def test_an_unknown_v1_path_on_the_api_host_names_the_apis_routes_too(app, client, acct):
    """Without CHAT_HOST (``make run``, ``make serve``: one host answers the API and the chat
    routes) ``/v1/nope`` answered that "the chat host serves POST /v1/chat/completions, …"
    — on the host that also serves ``/v1/module/…``, so a module caller who mistyped the path
    was pointed at the chat routes only. It names the module calls too, still in OpenAI's
    shape, which the openai SDK (the client that calls ``/v1/embeddings`` and the like) reads;
    a dedicated chat host (CHAT_HOST set) names what it serves."""
    for path in ("/v1/nope", "/v1/embeddings", "/v1/modules"):
        r = client.post(path, headers=acct.headers, json={})
        err = r.get_json()["error"]
        assert r.status_code == 404 and (err["type"], err["code"]) == ("not_found_error", "not_found"), r.get_json()
        assert err["message"].startswith(f"{path} is not a route of this gateway"), err
        assert "POST /v1/module/{slug}/call" in err["message"] and "POST /v1/chat/completions" in err["message"]
    r = client.post("/v1/chat/nope", headers=acct.headers, json={})
    assert r.status_code == 404 and r.get_json()["error"]["type"] == "not_found_error"
    r = client.post("/v1/messages/batches", headers=acct.headers, json={})
    assert r.status_code == 404 and r.get_json()["type"] == "error"
