"""SSRF (OWASP API7): every user-supplied URL the service will call is refused when it
points inside — loopback, RFC 1918, link-local/metadata, IPv6 loopback and mapped forms,
decimal/hex IPs, unspecified, CGNAT — with ``ALLOW_PRIVATE_URLS`` off (production);
cloud metadata and link-local targets are refused with it on as well (the embedded
default), and a module host that rebinds to an internal address after the check is
never reached (the connection goes to the address that was checked)."""
from __future__ import annotations

import re
import uuid

import pytest

from app.blueprints.fields import HTTPS_PATTERN

from tests import dnsstub
from tests.agentkit import Keypair, register, session_headers
from tests.gateway_helpers import (PROVIDER, balance_cents, call, create_module,  # noqa: F401
                                   provider, provider_server)

VECTORS = [
    "https://127.0.0.1/hook", "https://localhost/hook", "https://10.1.2.3/hook", "https://192.168.0.10/hook",
    "https://172.31.255.1/hook", "https://169.254.169.254/latest/meta-data/", "https://[::1]/hook",
    "https://[::ffff:127.0.0.1]/hook", "https://[::ffff:a9fe:a9fe]/hook", "https://2130706433/hook",
    "https://0x7f000001/hook", "https://0177.0.0.1/hook", "https://0.0.0.0/hook", "https://100.64.1.1/hook",
    "https://[fd00::1]/hook", "http://93.184.216.34/hook", "file:///etc/passwd", "gopher://127.0.0.1:6379/_",
]


def _refused(r, url) -> None:
    """A URL off the published pattern breaks the document (400); one of its shape that the
    SSRF guard refuses is 422 ``unprocessable`` (docs/decisions.md "Schema-valid requests")."""
    expected = (422, "unprocessable") if re.fullmatch(HTTPS_PATTERN, url) else (400, "invalid_request")
    assert (r.status_code, r.get_json()["error"]) == expected, (url, r.get_json())


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
    _refused(r, url)
    assert client.get("/api/alerts", headers=acct.headers).get_json()["alerts"] == []


@pytest.mark.parametrize("url", VECTORS)
def test_agent_webhook(client, make_account, strict, url):
    owner = make_account()
    r = register(client, owner, Keypair(), webhook=url)
    _refused(r, url)


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
    _refused(r, url)


# --- metadata and link-local: refused in every mode (ALLOW_PRIVATE_URLS on here) --------

METADATA = [
    "http://169.254.169.254/latest/meta-data", "http://169.254.170.2/v2/credentials", "http://[fe80::1]/",
    "http://[fd00:ec2::254]/latest/meta-data/", "http://metadata.google.internal/computeMetadata/v1/",
    "http://metadata/", "http://instance-data/latest/", "http://100.100.100.200/latest/meta-data",
    "http://2852039166/latest", "http://0xa9fea9fe/", "http://0251.0376.0251.0376/",
    "http://[::ffff:169.254.169.254]/", "http://[::ffff:a9fe:a9fe]/", "http://0.0.0.0/", "http://[::]/",
]


@pytest.mark.parametrize("url", METADATA)
@pytest.mark.parametrize("channel", ["webhook", "chat"])
def test_alert_metadata_targets_refused_on_the_embedded_default(app, client, make_account, channel, url):
    assert app.config["ALLOW_PRIVATE_URLS"] is True
    acct = make_account()
    r = client.post("/api/alerts", json={"name": "x", "metric": "calls", "op": ">", "threshold": 1,
                                         "window": "day", "channel": channel, "target": url},
                    headers=acct.headers)
    _refused(r, url)
    assert "target" in r.get_json()["message"]
    assert client.get("/api/alerts", headers=acct.headers).get_json()["alerts"] == []


@pytest.mark.parametrize("url", METADATA)
def test_agent_webhooks_to_metadata_refused_on_the_embedded_default(client, make_account, url):
    owner = make_account()
    r = register(client, owner, Keypair(), webhook=url)
    _refused(r, url)
    kp = Keypair()
    assert register(client, owner, kp).status_code == 201
    r = client.post("/api/agent/build", json={"slug": "meta-probe", "price_cents": 1, "actions": ["go"],
                                              "webhook": url}, headers=session_headers(client, kp))
    _refused(r, url)


# --- DNS rebinding on the module path ----------------------------------------------------

def test_module_host_rebinding_to_loopback_is_never_reached(app, client, make_account, provider,
                                                            strict, monkeypatch, ledger_clean):
    """The check resolves a public address, the connection's lookup answers 127.0.0.1 (the
    stand-in provider): the call must fail uncharged without reaching it."""
    dns = dnsstub.install(monkeypatch)
    host = f"rebind-{uuid.uuid4().hex[:8]}.example"
    dns.answers[host] = ["93.184.216.34", "127.0.0.1"]
    create_module(app, "rebind", provider.replace("127.0.0.1", host), {"ok": (1, "/ok")})
    acct = make_account(cents=5)
    r = call(client, acct, {"action": "ok"}, slug="rebind")
    assert r.status_code == 502 and r.get_json()["error"] == "provider_error", r.get_json()
    assert PROVIDER.requests == [] and balance_cents(app, acct.id) == 5
    assert dns.lookups[host] == 2
    ledger_clean()


@pytest.mark.parametrize("upstream", ["http://169.254.169.254/latest", "http://metadata.google.internal",
                                      "http://[::ffff:169.254.169.254]"])
def test_module_upstream_on_metadata_refused_before_charging(app, client, make_account, upstream,
                                                            ledger_clean):
    from sqlalchemy import func, select

    from app.extensions import db
    from app.models import ModuleCall

    create_module(app, "meta-up", upstream, {"ok": (1, "/ok")})
    acct = make_account(cents=5)
    r = call(client, acct, {"action": "ok"}, slug="meta-up")
    assert r.status_code == 502 and r.get_json()["error"] == "provider_error", r.get_json()
    with app.app_context():
        assert db.session.scalar(select(func.count()).select_from(ModuleCall)
                                 .where(ModuleCall.account_id == acct.id)) == 0
        db.session.remove()
    assert balance_cents(app, acct.id) == 5
    ledger_clean()
