"""How many stop sequences each provider API takes: OpenAI's chat completions at most 4
(``stop``), the Messages API up to 16 (``stop_sequences``, as the gateway's document says).
A request with more used to be sent to whichever candidate was cheapest, and an
OpenAI-compatible one answered its own 400 after the hold was taken. Now the router prefers
the candidates that can honour it and, when none can, refuses it before any hold, naming the
parameter in the caller's API's words. m-both (added here): an OpenAI-compatible offer
(cheap) and a dearer Anthropic one (claude); m-big: OpenAI-compatible only."""
from __future__ import annotations

from sqlalchemy import select

from app.extensions import db
from app.models import ChatCompletion
from tests.api.test_chat import START, acct, chat, figures, fakes, upstreams  # noqa: F401

SIX = ["one", "two", "three", "four", "five", "six"]
MSGS = [{"role": "user", "content": "hello"}]
BOTH = """
  - id: m-both
    auto: false
    context_window: 100000
    max_output_tokens: 4000
    capabilities: [streaming]
    providers:
      - {provider: cheap, upstream_model: both-at-cheap, input_usd_per_mtok: "1", output_usd_per_mtok: "2"}
      - {provider: claude, upstream_model: both-at-claude, input_usd_per_mtok: "4", output_usd_per_mtok: "20"}
"""


def _with_m_both(app, tmp_path):
    path = tmp_path / "models-test.yaml"
    path.write_text(path.read_text() + BOTH)
    app.extensions.pop("chat_catalog", None)


def _message(client, key, **body):
    return client.post("/v1/messages", headers={"x-api-key": key}, json={"max_tokens": 64, "messages": MSGS, **body})


def _rows(app) -> int:
    with app.app_context():
        n = len(db.session.execute(select(ChatCompletion.id)).all())
        db.session.remove()
    return n


def test_more_stop_sequences_than_openai_takes_go_to_a_provider_that_takes_them(
        app, client, fakes, acct, tmp_path, ledger_clean):  # noqa: F811
    _with_m_both(app, tmp_path)
    r = _message(client, acct.key, model="m-both", stop_sequences=SIX)
    assert r.status_code == 200, r.get_json()
    assert r.headers["X-Chat-Provider"] == "claude" and fakes.cheap.calls == 0
    assert fakes.claude.bodies[0]["stop_sequences"] == SIX
    r = _message(client, acct.key, model="m-both", stop_sequences=SIX[:4])  # four: the cheapest, as before
    assert r.status_code == 200 and r.headers["X-Chat-Provider"] == "cheap"
    assert fakes.cheap.bodies[0]["stop"] == SIX[:4]
    r = chat(client, acct, model="m-both", max_tokens=64, stop=SIX)  # the same rule for chat completions
    assert r.status_code == 200 and r.headers["X-Chat-Provider"] == "claude", r.get_json()
    ledger_clean()


def test_when_no_candidate_takes_them_the_request_is_refused_before_any_hold(
        app, client, fakes, acct, ledger_clean):  # noqa: F811
    for model in ("m-big", "auto"):
        r = _message(client, acct.key, model=model, stop_sequences=SIX)
        assert r.status_code == 400, r.get_json()
        body = r.get_json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert body["error"]["code"] == "no_matching_model", body
        assert "stop_sequences" in body["error"]["message"] and "6" in body["error"]["message"], body
        r = chat(client, acct, model=model, max_tokens=64, stop=SIX)
        assert r.status_code == 400, r.get_json()
        error = r.get_json()["error"]
        assert (error["code"], error["param"], error["type"]) == ("no_matching_model", "stop", "invalid_request_error")
        assert "stop" in error["message"] and "stop_sequences" not in error["message"]
    assert fakes.pricey.calls == fakes.cheap.calls == fakes.claude.calls == 0
    assert figures(app, acct.id)["balance"] == START and _rows(app) == 0  # no hold, nothing moved
    ledger_clean()


def test_a_test_key_gets_the_answer_a_live_key_would(app, client, fakes, acct, tmp_path, ledger_clean):  # noqa: F811
    """Test keys reach only the sandbox provider (OpenAI-compatible, takes any number): the
    rule is judged on the model's own providers, so test mode refuses what live mode refuses
    and serves what live mode serves."""
    _with_m_both(app, tmp_path)
    assert _message(client, acct.test_key, model="m-both", stop_sequences=SIX).status_code == 200
    r = _message(client, acct.test_key, model="m-big", stop_sequences=SIX)
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "no_matching_model", r.get_json()
    ledger_clean()
