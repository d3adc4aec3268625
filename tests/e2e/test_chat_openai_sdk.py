"""The official OpenAI Python SDK against the chat host running under gunicorn, routed to
the demo LLM (the embedded default's catalog): plain, streaming and tool-calling requests."""
from __future__ import annotations

import openai
import pytest
from openai import OpenAI

from demo.llm import DemoLLMHandler
from app.extensions import db
from app.services.money import ledger
from tests.support.apps import app_env, gunicorn
from tests.support.standin import serve


@pytest.fixture(scope="module")
def demo_llm():
    with serve(DemoLLMHandler) as url:
        yield url


def test_openai_sdk_plain_streaming_and_tools(app, make_account, demo_llm, ledger_clean):
    acct = make_account(cents=100)
    env = app_env(app.config)
    env.update({"DEMO_LLM_BASE_URL": demo_llm + "/v1", "CHAT_HOST": "127.0.0.1"})
    env.pop("CHAT_CATALOG", None)
    with gunicorn(env) as base:
        client = OpenAI(base_url=base + "/v1", api_key=acct.key, max_retries=0)

        models = [m.id for m in client.models.list()]
        assert models == ["auto", "demo-mini", "demo-standard", "demo-large"]
        assert client.models.retrieve("demo-large").model_extra["context_window"] == 200000

        resp = client.chat.completions.create(
            model="demo-mini", messages=[{"role": "user", "content": "hello gateway"}])
        assert resp.choices[0].message.content == "Echo: hello gateway"
        assert resp.model == "demo-mini" and resp.id.startswith("chatcmpl-")
        # demo usage: prompt 3 + 2 words, completion 3 words; demo-mini $0.10 / $0.40 per Mtok
        assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (5, 3)
        extra = resp.usage.model_extra
        assert extra["cost_micros"] == round(5 * 0.10 + 3 * 0.40) == 2 and extra["cost_usd"] == 0.000002
        assert extra["savings_pct"] == 0.0 and extra["latency_ms"] >= 0

        auto = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}])
        assert auto.model == "demo-mini"
        # reference gpt-4o ($2.50 / $10): 4 × 2.5 + 2 × 10 = 30 micros; demo-mini: 0.4 + 0.8 → 1
        assert auto.usage.model_extra["cost_micros"] == 1 and auto.usage.model_extra["savings_pct"] == 96.67

        stream = client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "stream these words"}], stream=True)
        chunks = list(stream)
        # every chunk has a choice (OpenAI's usage-only chunk is for include_usage): the usual
        # loop reading choices[0] works; the usage and cost ride on the finishing chunk
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert text == "Echo: stream these words"
        assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].usage.completion_tokens == 4
        assert chunks[-1].usage.model_extra["estimated"] is False
        chunks = list(client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "stream these words"}], stream=True,
            stream_options={"include_usage": True}))
        assert chunks[-1].choices == [] and chunks[-1].usage.model_extra["cost_micros"] > 0

        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}]
        resp = client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "Paris"}], tools=tools)
        call = resp.choices[0].message.tool_calls[0]
        assert resp.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "get_weather" and call.function.arguments == '{"city": "Paris"}'
        followup = client.chat.completions.create(model="auto", tools=tools, messages=[
            {"role": "user", "content": "Paris"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
        assert followup.choices[0].message.content == "Tool result: sunny"

        with pytest.raises(openai.AuthenticationError):
            OpenAI(base_url=base + "/v1", api_key="svc_live_nope", max_retries=0).chat.completions.create(
                model="auto", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.NotFoundError) as exc:
            client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
        assert exc.value.code == "model_not_found" and "nope" in str(exc.value)  # OpenAI's error shape

    with app.app_context():
        spent = 1_000_000 - ledger.balance(ledger.customer(acct.id))
        assert spent == ledger.balance(ledger.REVENUE) > 0 and ledger.balance("hold:chat") == 0
        db.session.remove()
    ledger_clean()
