"""The chat host as LLM developers meet it (issue 39), with the real clients against the
app under gunicorn, routed to the demo LLM: the `openai` SDK shows the API's message and
code for 400, 401, 402 and 429; the `anthropic` SDK's `messages.create` and
`messages.stream` work with `model="auto"` (x-api-key auth, cost in usage, Anthropic's
errors); the cost headers reach the client."""
from __future__ import annotations

import anthropic
import openai
import pytest
from openai import OpenAI

from app.extensions import db
from app.models import ChatCompletion
from app.services.money import ledger
from demo.llm import DemoLLMHandler
from tests.support.apps import app_env, gunicorn
from tests.support.standin import serve


@pytest.fixture(scope="module")
def demo_llm():
    with serve(DemoLLMHandler) as url:
        yield url


@pytest.fixture
def server(app, demo_llm):
    env = app_env(app.config)
    env.update({"DEMO_LLM_BASE_URL": demo_llm + "/v1", "CHAT_HOST": "127.0.0.1"})
    env.pop("CHAT_CATALOG", None)
    with gunicorn(env) as base:
        yield base


def test_openai_sdk_errors_show_the_message_and_code(app, make_account, server, ledger_clean):
    acct = make_account(cents=100)
    client = OpenAI(base_url=server + "/v1", api_key=acct.key, max_retries=0)
    hi = [{"role": "user", "content": "hi"}]

    with pytest.raises(openai.BadRequestError) as exc:  # 400: names the field
        client.chat.completions.create(model="auto", messages=[{"role": "robot", "content": "x"}])
    assert exc.value.code == "invalid_request" and exc.value.param == "messages.0.role"
    assert "messages.0.role: must be one of" in str(exc.value) and exc.value.type == "invalid_request_error"
    assert exc.value.request_id and exc.value.body["message"] in str(exc.value)

    with pytest.raises(openai.AuthenticationError) as exc:  # 401
        OpenAI(base_url=server + "/v1", api_key="svc_live_nope", max_retries=0).chat.completions.create(
            model="auto", messages=hi)
    assert exc.value.code == "unauthorized" and "Invalid, expired or revoked credential." in str(exc.value)

    poor = make_account(cents=0)
    with pytest.raises(openai.APIStatusError) as exc:  # 402: how to pay
        OpenAI(base_url=server + "/v1", api_key=poor.key, max_retries=0).chat.completions.create(
            model="auto", messages=hi)
    assert exc.value.status_code == 402 and exc.value.code == "payment_required"
    assert "POST /api/wallet/fund" in str(exc.value) and exc.value.type == "insufficient_quota"
    body = exc.value.response.json()
    assert body["fund_endpoint"] == "POST /api/wallet/fund" and body["request_id"] == exc.value.request_id
    assert exc.value.response.headers["X-Price-Micros"]

    limited = make_account(cents=100)  # the starter plan: 10 requests per second per key
    lclient = OpenAI(base_url=server + "/v1", api_key=limited.key, max_retries=0)
    with pytest.raises(openai.RateLimitError) as exc:  # 429
        for _ in range(40):
            lclient.models.list()
    assert exc.value.code == "rate_limited" and "Rate limit of" in str(exc.value)
    assert exc.value.response.headers["Retry-After"]

    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="nope", messages=hi)
    assert exc.value.code == "model_not_found" and exc.value.param == "model"

    raw = client.chat.completions.with_raw_response.create(model="auto", messages=hi)
    done = raw.parse()
    assert raw.headers["x-gateway-cost-micros"] == str(done.usage.model_extra["cost_micros"])
    assert float(raw.headers["x-gateway-savings-pct"]) == done.usage.model_extra["savings_pct"]
    assert float(raw.headers["x-gateway-overhead-ms"]) >= 0
    assert done.usage.model_extra["cost"] == done.usage.model_extra["cost_usd"]
    ledger_clean()


def test_anthropic_sdk_create_stream_and_errors(app, make_account, server, ledger_clean):
    acct = make_account(cents=1)  # one cent: a one-line completion with model auto fits the hold
    client = anthropic.Anthropic(base_url=server, api_key=acct.key, max_retries=0)

    msg = client.messages.create(model="auto", max_tokens=64, system="Be brief.",
                                 messages=[{"role": "user", "content": "hello gateway"}])
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "demo-mini"
    assert msg.id.startswith("msg_") and msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Echo: hello gateway"
    assert msg.usage.output_tokens == 3 and msg.usage.input_tokens > 0
    assert msg.usage.cache_read_input_tokens == 0 and msg.usage.cache_creation_input_tokens == 0
    extra = msg.usage.model_extra
    assert extra["cost_micros"] >= 1 and extra["savings_pct"] > 0 and extra["cost"] == extra["cost_usd"]

    # bearer auth too, content blocks, no max_tokens needed beyond the request's own
    bearer = anthropic.Anthropic(base_url=server, auth_token=acct.key, api_key=None, max_retries=0)
    msg = bearer.messages.create(model="demo-mini", max_tokens=32, messages=[
        {"role": "user", "content": [{"type": "text", "text": "blocks work"}]}])
    assert msg.content[0].text == "Echo: blocks work"

    words = [{"role": "user", "content": "stream these words"}]
    with client.messages.stream(model="auto", max_tokens=64, messages=words) as stream:
        seen = list(stream)
        final = stream.get_final_message()
    events = [e.type for e in seen]
    assert final.content[0].text == "Echo: stream these words" and final.stop_reason == "end_turn"
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(events)
    assert final.usage.output_tokens == 4 and final.usage.input_tokens > 0
    # message_start: the prompt as the gateway estimates it (the demo LLM counts at the end
    # only), what count_tokens answers for the model; it said 0 until 2026-11-29
    estimate = client.messages.count_tokens(model=final.model, messages=words).input_tokens
    assert seen[0].message.usage.input_tokens == estimate > 0
    # the final usage (message_delta's, cumulative) is what was recorded and charged
    (delta,) = [e for e in seen if e.type == "message_delta"]
    with app.app_context():
        row = db.session.get(ChatCompletion, "chatcmpl-" + final.id.removeprefix("msg_"))
        assert (row.prompt_tokens, row.completion_tokens) == (final.usage.input_tokens, final.usage.output_tokens)
        assert row.cost_micros == delta.usage.model_extra["cost_micros"] > 0
        db.session.remove()

    with pytest.raises(anthropic.AuthenticationError) as exc:
        anthropic.Anthropic(base_url=server, api_key="svc_live_nope", max_retries=0).messages.create(
            model="auto", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert exc.value.body["error"]["type"] == "authentication_error"
    assert "revoked credential" in str(exc.value) and exc.value.request_id
    with pytest.raises(anthropic.NotFoundError) as exc:
        client.messages.create(model="nope", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert exc.value.body["error"] == {"type": "not_found_error", "code": "model_not_found",
                                       "message": exc.value.body["error"]["message"]}
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(model="auto", max_tokens=0, messages=[{"role": "user", "content": "hi"}])
    assert exc.value.body["type"] == "error" and exc.value.body["error"]["type"] == "invalid_request_error"

    with app.app_context():
        spent = 10_000 - ledger.balance(ledger.customer(acct.id))
        assert spent == ledger.balance(ledger.REVENUE) > 0 and ledger.balance("hold:chat") == 0
        db.session.remove()
    ledger_clean()


def test_anthropic_sdk_counts_tokens_free(app, make_account, server, ledger_clean):
    """The ``anthropic`` SDK's ``messages.count_tokens`` (what Claude Code and LangChain call
    through a base URL) reaches ``POST /v1/messages/count_tokens``: the gateway's estimate,
    which grows with the prompt and its tools, moves no money (a balance of nothing is
    enough), and an unknown model is the SDK's ``NotFoundError`` as for ``messages.create``."""
    acct = make_account(cents=0)
    client = anthropic.Anthropic(base_url=server, api_key=acct.key, max_retries=0)
    hi = [{"role": "user", "content": "hello gateway"}]
    tool = {"name": "get_weather", "description": "The weather in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}

    counted = client.messages.count_tokens(model="demo-mini", messages=hi)
    assert counted.input_tokens > 0 and counted.to_dict() == {"input_tokens": counted.input_tokens}
    system = client.messages.count_tokens(model="demo-mini", messages=hi, system="Be brief.")
    tools = client.messages.count_tokens(model="demo-mini", messages=hi, system="Be brief.", tools=[tool],
                                         tool_choice={"type": "auto"})
    assert counted.input_tokens < system.input_tokens < tools.input_tokens
    assert client.messages.count_tokens(model="auto", messages=hi).input_tokens > 0
    raw = client.messages.with_raw_response.count_tokens(model="demo-mini", messages=hi)
    assert raw.headers["request-id"] and raw.parse().input_tokens == counted.input_tokens

    with pytest.raises(anthropic.NotFoundError) as exc:
        client.messages.count_tokens(model="nope", messages=hi)
    assert exc.value.body["error"]["type"] == "not_found_error" and exc.value.body["error"]["code"] == "model_not_found"
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.count_tokens(model="demo-mini", messages=[{"role": "robot", "content": "x"}])
    assert exc.value.body["error"]["type"] == "invalid_request_error" and exc.value.request_id
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server, api_key="svc_live_nope", max_retries=0).messages.count_tokens(
            model="demo-mini", messages=hi)

    with app.app_context():
        assert ledger.balance(ledger.customer(acct.id)) == 0 and ledger.balance("hold:chat") == 0
        db.session.remove()
    ledger_clean()
