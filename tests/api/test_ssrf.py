"""SSRF (OWASP API7): every user-supplied URL the service will call is refused when it
points inside — loopback, RFC 1918, link-local/metadata, IPv6 loopback and mapped forms,
decimal/hex IPs, unspecified, CGNAT — with ``ALLOW_PRIVATE_URLS`` off (production)."""
from __future__ import annotations

import pytest

from tests.agentkit import Keypair, register, session_headers

VECTORS = [
    "https://127.0.0.1/hook", "https://localhost/hook", "https://10.1.2.3/hook", "https://192.168.0.10/hook",
    "https://172.31.255.1/hook", "https://169.254.169.254/latest/meta-data/", "https://[::1]/hook",
    "https://[::ffff:127.0.0.1]/hook", "https://[::ffff:a9fe:a9fe]/hook", "https://2130706433/hook",
    "https://0x7f000001/hook", "https://0177.0.0.1/hook", "https://0.0.0.0/hook", "https://100.64.1.1/hook",
    "https://[fd00::1]/hook", "http://93.184.216.34/hook", "file:///etc/passwd", "gopher://127.0.0.1:6379/_",
]


@pytest.fixture
def strict(app):
    app.config["ALLOW_PRIVATE_URLS"] = False
    yield
    app.config["ALLOW_PRIVATE_URLS"] = True


@pytest.mark.parametrize("url", VECTORS)
@pytest.mark.parametrize("channel", ["webhook", "chat"])
def test_alert_targets(client, make_account, strict, channel, url):
    acct = make_account()
    r = client.post("/api/alerts", json={"name": "x", "metric": "calls", "op": ">", "threshold": 1,
                                         "window": "day", "channel": channel, "target": url},
                    headers=acct.headers)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request", (url, r.get_json())
    assert client.get("/api/alerts", headers=acct.headers).get_json()["alerts"] == []


@pytest.mark.parametrize("url", VECTORS)
def test_agent_webhook(client, make_account, strict, url):
    owner = make_account()
    r = register(client, owner, Keypair(), webhook=url)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request", (url, r.get_json())


@pytest.mark.parametrize("url", VECTORS)
def test_agent_module_webhook(client, make_account, app, url):
    owner = make_account()
    kp = Keypair()
    assert register(client, owner, kp).status_code == 201
    headers = session_headers(client, kp)
    app.config["ALLOW_PRIVATE_URLS"] = False
    try:
        r = client.post("/api/agent/build", json={"slug": "ssrf-probe", "price_cents": 1,
                                                  "actions": ["go"], "webhook": url}, headers=headers)
    finally:
        app.config["ALLOW_PRIVATE_URLS"] = True
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request", (url, r.get_json())
