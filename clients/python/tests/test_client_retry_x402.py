"""Retries that never charge twice (a proxy in front of the live server loses the first
answer) and x402 auto-pay with the official x402 client and an eth-account wallet."""
from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

import pytest
from eth_account import Account as EthAccount

from gateway_client import Gateway, PaymentRequired, RetryPolicy, ServerError
from tests.support.standin import serve as http_server


def failing_proxy(upstream: str, fail: dict):
    """A proxy class forwarding to ``upstream``; ``fail`` = {"status": 503|429,
    "times": n, "forward_first": bool}: the first ``n`` requests are answered with
    ``status`` (after forwarding them when ``forward_first``: the answer is lost)."""
    target = urlsplit(upstream)

    class Proxy(BaseHTTPRequestHandler):
        seen: list = []
        lock = threading.Lock()

        def log_message(self, *args):
            pass

        def _forward(self, body: bytes):
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()

        def _handle(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with self.lock:
                type(self).seen.append(dict(self.headers))
                failing = len(self.seen) <= fail["times"]
            if failing:
                if fail.get("forward_first"):
                    self._forward(body)
                self.send_response(fail["status"])
                self.send_header("Content-Type", "application/json")
                if fail["status"] == 429 or fail.get("retry_after"):
                    self.send_header("Retry-After", str(fail.get("retry_after", 1)))
                payload = b'{"error": "service_unavailable", "message": "proxy lost it"}'
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            status, headers, data = self._forward(body)
            self.send_response(status)
            for k, v in headers:
                if k.lower() not in ("transfer-encoding", "connection", "server", "date"):
                    self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _handle

    return type("P", (Proxy,), {"seen": []})


def test_lost_answer_is_retried_with_the_same_key_and_charged_once(server, make_account, ledger_clean):
    acct = make_account(cents=100)
    proxy = failing_proxy(server.url, {"status": 503, "times": 1, "forward_first": True})
    with http_server(proxy) as url, Gateway(acct.key, url) as gw:
        res = gw.call("text", action="slugify", text="charged once")
        keys = [h.get("Idempotency-Key") for h in proxy.seen]
        assert len(keys) == 2 and keys[0] == keys[1] == res.idempotency_key
        assert res.replayed and res.verify()  # the server's stored answer of the first attempt
        assert gw.account().balance_cents == 98
    ledger_clean()


def test_a_lost_alert_create_is_retried_and_makes_one_alert(server, make_account):
    """``alerts.create`` sends an Idempotency-Key, so the client retries a lost 201 and the
    server answers the first alert again (before: no key, no retry, and a caller's own
    retry made a second alert)."""
    acct = make_account(cents=100)
    proxy = failing_proxy(server.url, {"status": 503, "times": 1, "forward_first": True})
    with http_server(proxy) as url, Gateway(acct.key, url) as gw:
        alert = gw.alerts.create(name="spend", metric="spend_cents", op=">=", threshold=100,
                                 window="day", channel="email", target="ops@example.com")
        keys = [h.get("Idempotency-Key") for h in proxy.seen]
        assert len(keys) == 2 and keys[0] == keys[1] and keys[0]
        assert [a.id for a in gw.alerts.list()] == [alert.id]


def test_a_lost_checkout_is_retried_and_starts_one_checkout(server, make_account):
    """``pay.checkout`` sends an Idempotency-Key (the route takes one), so a lost answer is
    retried and answered with the first checkout (before: no key, ServerError, and the
    caller's own retry started a second pending payment)."""
    acct = make_account(cents=100)
    proxy = failing_proxy(server.url, {"status": 503, "times": 1, "forward_first": True})
    with http_server(proxy) as url, Gateway(acct.key, url) as gw:
        co = gw.pay.checkout(500, product="credits")
        keys = [h.get("Idempotency-Key") for h in proxy.seen]
        assert len(keys) == 2 and keys[0] == keys[1] and keys[0]
        assert [p.id for p in gw.pay.history()] == [co.payment_id]
        again = gw.pay.checkout(500, product="credits", idempotency_key=keys[0])
        assert (again.payment_id, again.url) == (co.payment_id, co.url)


def test_no_retry_without_retries_and_for_unsafe_posts(server, make_account):
    acct = make_account(cents=100)
    proxy = failing_proxy(server.url, {"status": 503, "times": 1})
    with http_server(proxy) as url, Gateway(acct.key, url, max_retries=0) as gw:
        with pytest.raises(ServerError) as exc:
            gw.call("text", action="slugify", text="x")
        assert exc.value.status == 503 and exc.value.code == "service_unavailable"
    proxy = failing_proxy(server.url, {"status": 503, "times": 1})
    with http_server(proxy) as url, Gateway(acct.key, url) as gw:
        with pytest.raises(ServerError):  # POST /api/keys has no Idempotency-Key: not repeated
            gw.keys.create("not-retried")
        assert len(proxy.seen) == 1


def test_a_connection_that_could_not_be_opened_is_retried_for_every_request(server, make_account):
    """Connection refused (the gateway restarting): nothing was sent, so even a POST
    without an Idempotency-Key is tried again (the README: "connection failures are
    retried"); before, ``keys.create`` raised ConnectError at once. One key is made."""
    import socket
    from http.server import ThreadingHTTPServer

    acct = make_account(cents=100)
    with socket.socket() as probe:  # a free port, nobody listening yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proxy = failing_proxy(server.url, {"status": 503, "times": 0})
    started: list = []

    def open_port():  # binding is what makes connections succeed: only after 0.5 s
        started.append(ThreadingHTTPServer(("127.0.0.1", port), proxy))
        started[0].serve_forever()

    opened = threading.Timer(0.5, open_port)
    opened.start()
    try:
        with Gateway(acct.key, f"http://127.0.0.1:{port}",
                     retry=RetryPolicy(max_retries=6, backoff=0.2, max_backoff=0.4)) as gw:
            made = gw.keys.create("made-once")
            assert [k.id for k in gw.keys.list() if k.name == "made-once"] == [made.id]
            assert len([h for h in proxy.seen if h.get("Content-Length")]) == 1  # the POST, once
    finally:
        opened.cancel()
        if started:
            started[0].shutdown()
            started[0].server_close()


def test_every_error_carries_the_retry_after_it_was_sent(server, make_account):
    """The gateway sends Retry-After with a 503 too (database busy: 1 s, not ready: 5 s);
    once the retries are spent the ServerError carries it, as a RateLimited does (before:
    only RateLimited had ``retry_after``; others had to dig in ``headers``)."""
    acct = make_account(cents=100)
    proxy = failing_proxy(server.url, {"status": 503, "times": 1, "retry_after": 7})
    with http_server(proxy) as url, Gateway(acct.key, url, max_retries=0) as gw:
        with pytest.raises(ServerError) as exc:
            gw.account()
        assert exc.value.retry_after == 7.0 and exc.value.status == 503
        with pytest.raises(PaymentRequired) as e402:  # an error sent without one: None
            Gateway(make_account(cents=0).key, server.url).call("echo", action="echo")
        assert e402.value.retry_after is None


def test_retry_after_of_a_429_is_honoured(server, make_account):
    acct = make_account(cents=100)
    proxy = failing_proxy(server.url, {"status": 429, "times": 1})
    with http_server(proxy) as url, Gateway(acct.key, url) as gw:
        started = time.monotonic()
        assert gw.account().id == acct.id
        assert time.monotonic() - started >= 1.0 and len(proxy.seen) == 2


def test_x402_auto_pay(server, make_account, ledger_clean):
    acct = make_account(cents=0)
    wallet = EthAccount.create()
    with Gateway(acct.key, server.url) as plain:
        with pytest.raises(PaymentRequired):
            plain.call("text", action="word_count", text="pay per call")
    with Gateway(acct.key, server.url, x402_account=wallet) as gw:
        res = gw.call("text", action="word_count", text="pay per call")
        assert res.ok and res.result["words"] == 3 and res.verify()
        assert res.payment and res.payment["success"] and res.payment["payer"] == wallet.address
        assert gw.account().balance_cents == 0
        hist = gw.pay.history()
        assert [p.method for p in hist] == ["x402"] and hist[0].status == "succeeded"
    ledger_clean()
