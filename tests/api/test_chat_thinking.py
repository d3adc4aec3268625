"""Thinking: the Messages API's ``thinking`` and chat completions' ``reasoning_effort`` were
taken and dropped, so no provider was ever asked to think. A model that can think (catalog
capability ``reasoning``) is now asked in its provider's terms — an Anthropic provider gets
``thinking``, an OpenAI-compatible one ``reasoning_effort`` — and one that cannot is asked
nothing (the request is served as before). Thinking tokens are output tokens, billed as
usage is billed. m-claude (Anthropic, reasoning), m-big (OpenAI-compatible, reasoning),
m-small (OpenAI-compatible, no reasoning); the fakes record what they were sent."""
from __future__ import annotations

import orjson

from tests.api.test_chat import START, acct, chat, figures, fakes, upstreams  # noqa: F401
from tests.chatfakes import THOUGHT

MSGS = [{"role": "user", "content": "hello"}]
THINK = {"type": "enabled", "budget_tokens": 2000}


def _message(client, key, **body):
    return client.post("/v1/messages", headers={"x-api-key": key}, json={"max_tokens": 4000, "messages": MSGS, **body})


def test_an_anthropic_provider_is_asked_to_think_and_its_thinking_comes_back(app, client, fakes, acct, ledger_clean):  # noqa: F811
    r = _message(client, acct.key, model="m-claude", thinking=THINK)
    assert r.status_code == 200, r.get_json()
    assert fakes.claude.bodies[0]["thinking"] == THINK and fakes.claude.bodies[0]["max_tokens"] == 4000
    msg = r.get_json()
    assert msg["content"][0] == THOUGHT and msg["content"][1]["type"] == "text"  # to send back next turn
    # thinking tokens are inside Anthropic's output_tokens: billed at the output price as any output
    assert msg["usage"]["output_tokens"] == 10 and msg["usage"]["cost_micros"] == 20 * 4 + 10 * 20
    # chat completions' reasoning_effort is the budget of its effort
    r = chat(client, acct, model="m-claude", max_tokens=3000, reasoning_effort="high")
    assert r.status_code == 200 and fakes.claude.bodies[1]["thinking"] == {"type": "enabled", "budget_tokens": 2999}
    message = r.get_json()["choices"][0]["message"]
    assert message["reasoning_content"] == THOUGHT["thinking"] and message["thinking_blocks"] == [THOUGHT]
    r = chat(client, acct, model="m-claude", max_tokens=3000, reasoning_effort="low")
    assert fakes.claude.bodies[2]["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    # the answer sent back with the next turn: the blocks reach Anthropic, neither field another provider
    turns = [*MSGS, message, {"role": "user", "content": "and?"}]
    assert chat(client, acct, model="m-claude", max_tokens=3000, messages=turns).status_code == 200
    assert fakes.claude.bodies[3]["messages"][1]["content"][0] == THOUGHT
    assert chat(client, acct, model="m-big", max_tokens=64, messages=turns).status_code == 200
    assert set(fakes.pricey.bodies[0]["messages"][1]) == {"role", "content"}, fakes.pricey.bodies[0]
    # an output cap too small for Anthropic's least budget: no thinking rather than its 400
    chat(client, acct, model="m-claude", max_tokens=500, reasoning_effort="high")
    assert "thinking" not in fakes.claude.bodies[4]
    ledger_clean()


def test_an_openai_compatible_provider_is_sent_reasoning_effort_from_the_budget(app, client, fakes, acct, ledger_clean):  # noqa: F811
    for budget, effort in ((1024, "low"), (2000, "medium"), (3000, "high")):
        r = _message(client, acct.key, model="m-big", thinking={"type": "enabled", "budget_tokens": budget})
        assert r.status_code == 200, r.get_json()
        sent = fakes.pricey.bodies[-1]
        assert sent["reasoning_effort"] == effort and "thinking" not in sent
        assert sent["max_completion_tokens"] == 4000 and "max_tokens" not in sent  # what reasoning models take
    fakes.pricey.usage_extra = {"completion_tokens_details": {"reasoning_tokens": 30}}
    r = _message(client, acct.key, model="m-big", thinking=THINK)
    usage = r.get_json()["usage"]
    assert usage["output_tokens"] == 50 and usage["output_tokens_details"] == {"thinking_tokens": 30}
    assert usage["cost_micros"] == 100 * 5 + 50 * 15
    ledger_clean()


def test_a_model_that_cannot_think_is_asked_nothing(app, client, fakes, acct, ledger_clean):  # noqa: F811
    r = _message(client, acct.key, model="m-nousage", thinking=THINK)
    assert r.status_code == 200, r.get_json()
    r = chat(client, acct, model="m-small", max_tokens=64, reasoning_effort="high")
    assert r.status_code == 200, r.get_json()
    sent = fakes.nousage.bodies + fakes.cheap.bodies
    assert len(sent) == 2 and all("thinking" not in b and "reasoning_effort" not in b for b in sent), sent
    ledger_clean()


def test_auto_prefers_a_model_that_can_think(app, client, fakes, acct, ledger_clean):  # noqa: F811
    r = _message(client, acct.key, model="auto", max_tokens=400, thinking={"type": "disabled"})
    assert r.headers["X-Chat-Model"] == "m-small"  # the cheapest, as before
    r = _message(client, acct.key, model="auto", max_tokens=4000, thinking=THINK)
    assert r.status_code == 200 and r.headers["X-Chat-Model"] == "m-big", r.get_json()
    assert fakes.pricey.bodies[-1]["reasoning_effort"] == "medium"
    ledger_clean()


def test_a_stream_carries_the_thinking_block(app, client, fakes, acct, ledger_clean):  # noqa: F811
    r = _message(client, acct.key, model="m-claude", thinking=THINK, stream=True)
    events = [orjson.loads(b.split(b"data: ", 1)[1]) for b in r.get_data().split(b"\n\n") if b"data: " in b]
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert starts[0]["type"] == "thinking" and starts[1]["type"] == "text", starts
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta" and e["index"] == 0]
    assert {"type": "thinking_delta", "thinking": THOUGHT["thinking"]} in deltas
    assert {"type": "signature_delta", "signature": THOUGHT["signature"]} in deltas
    assert fakes.claude.bodies[0]["thinking"] == THINK and fakes.claude.bodies[0]["stream"] is True
    ledger_clean()


def test_a_budget_not_below_max_tokens_is_refused_as_anthropic_refuses_it(app, client, fakes, acct):  # noqa: F811
    for thinking in ({"type": "enabled", "budget_tokens": 4000}, {"type": "enabled", "budget_tokens": 100},
                     {"type": "enabled"}, {"type": "sometimes"}):
        r = _message(client, acct.key, model="m-claude", thinking=thinking)
        assert r.status_code == 400 and r.get_json()["error"]["type"] == "invalid_request_error", r.get_json()
    assert fakes.claude.calls == 0 and figures(app, acct.id)["balance"] == START


def test_the_demo_llm_thinks_when_asked(app, client, fakes, acct, ledger_clean):  # noqa: F811
    """The local stand-in provider (the sandbox of test keys, ``make run``'s model) reports
    the reasoning it was asked for: ``reasoning_effort`` arrives and its tokens are billed."""
    r = _message(client, acct.test_key, model="m-big", thinking=THINK)
    assert r.status_code == 200, r.get_json()
    msg = r.get_json()
    assert msg["content"][-1]["text"].endswith("(thought: medium)")
    assert msg["usage"]["output_tokens_details"] == {"thinking_tokens": 32}
    r = _message(client, acct.test_key, model="m-nousage", thinking=THINK)  # cannot think: nothing asked
    assert "thought" not in r.get_json()["content"][-1]["text"] and "output_tokens_details" not in r.get_json()["usage"]
