"""Provider adapters: streamed events are relayed as they arrive (chunked or not)."""
from __future__ import annotations

import threading
from decimal import Decimal

import pytest

from app.services.chat import providers as llm_providers
from app.services.chat.catalog import Offer, Provider
from tests.support.standin import Reply, StandIn


@pytest.mark.parametrize("chunked", [False, True])
def test_stream_events_arrive_before_the_upstream_finishes(app, chunked):
    gate, late = threading.Event(), []

    def send(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data) if chunked else data

    def events():
        yield send(b'data: {"choices": [{"index": 0, "delta": {"content": "first"}}]}\n\n')
        late.append(not gate.wait(3))  # the rest only after the reader has seen "first"
        yield send(b'data: {"choices": [{"index": 0, "delta": {"content": " second"}}]}\n\ndata: [DONE]\n\n')
        if chunked:
            yield b"0\r\n\r\n"

    upstream = StandIn({("POST", "*"): lambda req: Reply(
        200, content_type="text/event-stream", chunks=events(),
        headers={"Transfer-Encoding": "chunked"} if chunked else {})})
    with upstream as url, app.app_context():
        offer = Offer("m", Provider("p", "openai", url, None, False, None), "m", Decimal(1), Decimal(1))
        it = llm_providers.stream(offer, {"model": "m", "messages": [{"role": "user", "content": "x"}]}, 10)
        assert next(it)["choices"][0]["delta"]["content"] == "first"
        gate.set()
        assert [c["choices"][0]["delta"]["content"] for c in it] == [" second"]
    assert late == [False]
