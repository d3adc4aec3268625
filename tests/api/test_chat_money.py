"""Chat charged exactly (issue 15): a stream that runs past CHAT_HOLD_TTL_SECONDS keeps its
hold (its heartbeat extends it; the stale-hold sweep leaves it alone) and is charged when
it ends; cache-read / cache-write tokens priced per provider."""
from __future__ import annotations

import time

import orjson

from app.services.billing import holds
from tests.api.test_chat import START, acct, chat, fakes, figures, upstreams  # noqa: F401


def test_long_stream_keeps_its_hold_and_is_charged(app, client, fakes, acct, ledger_clean):  # noqa: F811
    app.config["CHAT_HOLD_TTL_SECONDS"] = 0.3
    r = chat(client, acct, model="m-small", max_tokens=100, stream=True)
    assert r.status_code == 200
    body = iter(r.response)
    first = next(body)
    assert first.startswith(b"data: ")
    time.sleep(1.0)  # the client (or the upstream) is slow: the stream outlives the hold TTL
    with app.app_context():
        assert holds.release_stale_holds(0.3) == 0  # a live stream's hold is never released
    rest = b"".join(body)
    events = [orjson.loads(line[6:]) for line in (first + rest).split(b"\n\n") if line.startswith(b"data: {")]
    assert events[-1]["usage"]["cost_micros"] == 200
    assert figures(app, acct.id)["balance"] == START - 200
    assert figures(app, acct.id)["held"] == 0
    with app.app_context():  # once ended, nothing is left for the sweep
        assert holds.release_stale_holds(0) == 0
    ledger_clean()
