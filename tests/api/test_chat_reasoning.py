"""Reasoning and cached tokens are metered (issue 39): reasoning tokens at the output
price whether the upstream counts them inside ``completion_tokens`` (OpenAI) or reports
them apart (``total_tokens`` = prompt + completion + reasoning); cached prompt tokens at the
offer's cache-read price. m-small at cheap: $1 in, $2 out, $0.5 cache read per Mtok."""
from __future__ import annotations

import pytest

from tests.chatfakes import fakes, upstreams  # noqa: F401

MSGS = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def acct(make_account):
    return make_account(cents=100)


def _usage(client, acct, stream=False):
    r = client.post("/v1/chat/completions", json={"model": "m-small", "messages": MSGS, "stream": stream},
                    headers=acct.headers)
    assert r.status_code == 200
    if not stream:
        return r.get_json()["usage"]
    import orjson

    chunks = [orjson.loads(line[6:]) for line in r.get_data(as_text=True).splitlines()
              if line.startswith("data: {")]
    return chunks[-1]["usage"]


def test_reasoning_tokens_inside_completion_tokens_are_billed_once(client, fakes, acct, ledger_clean):
    fakes.cheap.usage_extra = {"completion_tokens_details": {"reasoning_tokens": 30}}  # total 150: inside
    usage = _usage(client, acct)
    assert usage["completion_tokens"] == 50 and usage["completion_tokens_details"] == {"reasoning_tokens": 30}
    assert usage["cost_micros"] == 100 * 1 + 50 * 2
    ledger_clean()


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_tokens_reported_apart_are_billed_at_the_output_price(client, fakes, acct, ledger_clean, stream):
    fakes.cheap.usage_extra = {"completion_tokens_details": {"reasoning_tokens": 30}, "total_tokens": 180}
    usage = _usage(client, acct, stream)
    assert usage["completion_tokens"] == 80 and usage["total_tokens"] == 180
    assert usage["cost_micros"] == 100 * 1 + 80 * 2
    ledger_clean()


def test_cached_tokens_at_the_cache_read_price(client, fakes, acct, ledger_clean):
    fakes.cheap.usage_extra = {"prompt_tokens_details": {"cached_tokens": 40}}
    usage = _usage(client, acct)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 40
    assert usage["cost_micros"] == 60 * 1 + 20 + 50 * 2  # 40 cached × $0.5 = 20 micros
    ledger_clean()


@pytest.mark.parametrize("stream", [False, True])
def test_the_messages_api_says_how_many_output_tokens_were_reasoning(client, fakes, acct, ledger_clean, stream):
    """The Messages API's usage breaks the billed ``output_tokens`` down
    (``output_tokens_details.thinking_tokens``, which the anthropic SDK's accumulator keeps
    from ``message_delta``); ``/v1/messages`` dropped the reasoning count an OpenAI-compatible
    provider reported, so a client could not tell why an answer cost more than its text."""
    import orjson

    fakes.cheap.usage_extra = {"completion_tokens_details": {"reasoning_tokens": 30}}
    r = client.post("/v1/messages", headers=acct.headers, json={
        "model": "m-small", "max_tokens": 64, "messages": MSGS, "stream": stream})
    assert r.status_code == 200
    if stream:
        events = [orjson.loads(b.split(b"\ndata: ", 1)[1]) for b in r.get_data().split(b"\n\n")
                  if b.startswith(b"event: message_delta")]
        usage = events[-1]["usage"]
    else:
        usage = r.get_json()["usage"]
    assert usage["output_tokens"] == 50 and usage["output_tokens_details"] == {"thinking_tokens": 30}
    assert usage["cost_micros"] == 100 * 1 + 50 * 2
    ledger_clean()
