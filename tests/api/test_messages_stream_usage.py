"""Token usage in a ``/v1/messages`` stream as Anthropic's own API reports it, and as the
gateway bills it: ``message_start`` carries the prompt's count (Claude Code, LiteLLM and the
``anthropic`` SDK's accumulator read it there), ``message_delta`` the cumulative usage —
input, output, cache writes and reads — which is what was charged; and how an answer from
an Anthropic provider ended.

Figures (tests/chatfakes.py): ``hello there`` is estimated at 10 prompt tokens for m-small
(1 token per 4 characters); the OpenAI-shaped fakes report 100 prompt + 50 completion tokens
at the end of a stream; the Anthropic fake counts 20 input tokens (plus ``usage_extra``) in
``message_start`` and 10 output tokens in ``message_delta``."""
from __future__ import annotations

import orjson
import pytest
from sqlalchemy import select

from app.extensions import db
from app.models import ChatCompletion
from app.services.money import ledger
from tests.chatfakes import fakes, upstreams  # noqa: F401

MSGS = [{"role": "user", "content": "hello there"}]
START = 1_000_000


@pytest.fixture
def acct(make_account):
    return make_account(cents=100)


def _stream(client, acct, **body) -> dict[str, list[dict]]:
    r = client.post("/v1/messages", headers={"x-api-key": acct.key},
                    json={"max_tokens": 64, "messages": MSGS, "stream": True, **body})
    assert r.status_code == 200, r.get_data()
    out: dict[str, list[dict]] = {}
    for block in r.get_data().split(b"\n\n"):
        if block.startswith(b"event: "):
            data = orjson.loads(block.split(b"\ndata: ", 1)[1])
            out.setdefault(data["type"], []).append(data)
    return out


def _billed(app, account_id) -> tuple[ChatCompletion, int]:
    with app.app_context():
        row = db.session.execute(select(ChatCompletion)).scalar_one()
        spent = START - ledger.balance(ledger.customer(account_id))
        db.session.remove()
    return row, spent


NO_WRITES = {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}
ZERO_CACHE = {"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "cache_creation": NO_WRITES}


@pytest.mark.parametrize("model, usage_extra, start, final, cost", [
    # OpenAI-compatible upstream: its usage comes at the end, so message_start says the
    # gateway's own estimate of the prompt (the one its hold is sized for: 10), and
    # message_delta the provider's count (100 + 50), which is billed: 100×1 + 50×2 at cheap
    ("m-small", {}, {"input_tokens": 10, "output_tokens": 0, **ZERO_CACHE},
     {"input_tokens": 100, "output_tokens": 50, **ZERO_CACHE}, 200),
    # Anthropic upstream: its message_start counted the prompt (20 input, 300 read from the
    # cache, 40 written to it), passed on as counted; 20×4 + 300×0.4 + 40×5 + 10×20 = 600
    ("m-claude", {"cache_read_input_tokens": 300, "cache_creation_input_tokens": 40},
     {"input_tokens": 20, "output_tokens": 0, "cache_read_input_tokens": 300, "cache_creation_input_tokens": 40,
      "cache_creation": {**NO_WRITES, "ephemeral_5m_input_tokens": 40}},
     {"input_tokens": 20, "output_tokens": 10, "cache_read_input_tokens": 300, "cache_creation_input_tokens": 40,
      "cache_creation": {**NO_WRITES, "ephemeral_5m_input_tokens": 40}},
     600),
], ids=["openai-upstream", "anthropic-upstream"])
def test_message_start_carries_the_prompt_and_message_delta_what_was_billed(app, client, fakes, acct, ledger_clean,
                                                                             model, usage_extra, start, final, cost):
    """``message_start`` said ``input_tokens: 0``: a client reading the prompt's size there
    (Claude Code's context meter, LiteLLM's usage, the SDK's snapshot before the end) saw an
    empty prompt."""
    fakes.claude.usage_extra = usage_extra
    events = _stream(client, acct, model=model)
    assert events["message_start"][0]["message"]["usage"] == start
    (delta,) = events["message_delta"]
    usage = delta["usage"]
    assert {k: usage[k] for k in final} == final and usage["estimated"] is False
    row, spent = _billed(app, acct.id)
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
    assert (row.prompt_tokens, row.completion_tokens) == (prompt, usage["output_tokens"])
    assert row.cost_micros == usage["cost_micros"] == spent == cost
    ledger_clean()


def test_message_delta_counts_from_an_anthropic_upstream_are_cumulative(app, client, fakes, acct, ledger_clean):
    """Anthropic's ``message_delta`` usage is cumulative and may restate the input counts
    (its SDK's accumulator overwrites ``message_start``'s with them): when it does, those are
    the counts, reported and billed — the gateway kept ``message_start``'s."""
    fakes.claude.delta_usage = {"input_tokens": 25, "cache_read_input_tokens": 100}
    events = _stream(client, acct, model="m-claude")
    assert events["message_start"][0]["message"]["usage"]["input_tokens"] == 20
    usage = events["message_delta"][0]["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"], usage["output_tokens"]) == (25, 100, 10)
    row, spent = _billed(app, acct.id)
    assert row.prompt_tokens == 125 and row.cost_micros == spent == 25 * 4 + 40 + 10 * 20 == usage["cost_micros"]
    ledger_clean()


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_cut_by_the_context_window_is_not_a_finished_one(app, client, fakes, acct, ledger_clean, stream):
    """Anthropic ends an answer that filled the model's context window with ``stop_reason:
    "model_context_window_exceeded"``; the gateway read any stop reason it did not know as
    ``stop`` / ``end_turn``, so a truncated answer passed for a complete one. It is OpenAI's
    ``length`` and the Messages API's ``max_tokens``, as for an answer cut by its cap."""
    fakes.claude.stop_reason = "model_context_window_exceeded"
    r = client.post("/v1/chat/completions", headers=acct.headers,
                    json={"model": "m-claude", "max_tokens": 64, "messages": MSGS, "stream": stream})
    assert r.status_code == 200
    if stream:
        chunks = [orjson.loads(b[6:]) for b in r.get_data().split(b"\n\n") if b.startswith(b"data: {")]
        finish = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c.get("finish_reason")]
        assert finish == ["length"]
        stop = _stream(client, acct, model="m-claude")["message_delta"][0]["delta"]["stop_reason"]
    else:
        assert r.get_json()["choices"][0]["finish_reason"] == "length"
        stop = client.post("/v1/messages", headers={"x-api-key": acct.key},
                           json={"model": "m-claude", "max_tokens": 64, "messages": MSGS}).get_json()["stop_reason"]
    assert stop == "max_tokens"
    ledger_clean()
