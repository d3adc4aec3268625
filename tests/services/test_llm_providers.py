"""Provider adapters: streamed events are relayed as they arrive (chunked or not)."""
from __future__ import annotations

import threading
from decimal import Decimal
from http.server import BaseHTTPRequestHandler

import pytest

from app.services.chat import providers as llm_providers
from app.services.chat.catalog import Offer, Provider
from tests.servers import http_server


@pytest.mark.parametrize("chunked", [False, True])
def test_stream_events_arrive_before_the_upstream_finishes(app, chunked):
    gate, late = threading.Event(), []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding" if chunked else "Connection", "chunked" if chunked else "close")
            self.end_headers()

            def send(data: bytes):
                if chunked:
                    data = b"%x\r\n%s\r\n" % (len(data), data)
                self.wfile.write(data)
                self.wfile.flush()

            send(b'data: {"choices": [{"index": 0, "delta": {"content": "first"}}]}\n\n')
            late.append(not gate.wait(3))  # the rest only after the reader has seen "first"
            send(b'data: {"choices": [{"index": 0, "delta": {"content": " second"}}]}\n\ndata: [DONE]\n\n')
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
            self.close_connection = True

    with http_server(Handler) as (_, url), app.app_context():
        offer = Offer("m", Provider("p", "openai", url, None, False, None), "m", Decimal(1), Decimal(1))
        it = llm_providers.stream(offer, {"model": "m", "messages": [{"role": "user", "content": "x"}]}, 10)
        assert next(it)["choices"][0]["delta"]["content"] == "first"
        gate.set()
        assert [c["choices"][0]["delta"]["content"] for c in it] == [" second"]
    assert late == [False]
