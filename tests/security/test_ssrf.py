"""SSRF (findings 3 and 4, fixed in platform/http.py + netguard.py): the address vectors
of the outbound-layer and API suites, refused through the alert webhook API in
production settings and by the URL check in every mode; and the DNS vectors: a name
answering a metadata or link-local address, on the first or a later lookup, is refused.
The vectors are imported from those suites, never copied."""
from __future__ import annotations

import pytest

from app.services.platform import http, netguard
from tests import dnsstub
from tests.api.test_ssrf import VECTORS
from tests.services.test_http import FORBIDDEN
from tests.support.standin import StandIn


@pytest.mark.parametrize("url", VECTORS)
def test_address_vectors_refused_by_the_api(client, make_account, app, monkeypatch, url):
    monkeypatch.setitem(app.config, "ALLOW_PRIVATE_URLS", False)
    r = client.post("/api/alerts", json={"name": "x", "metric": "calls", "op": ">", "threshold": 1,
                                         "window": "day", "channel": "webhook", "target": url},
                    headers=make_account().headers)
    # another scheme breaks the documented pattern (400); a well-formed http(s) URL whose
    # host the guard refuses is 422, a rule the schema cannot state
    assert r.status_code == (422 if url.startswith(("http://", "https://")) else 400)
    assert "target" in r.get_json()["message"]


@pytest.mark.parametrize("allow", [True, False])
@pytest.mark.parametrize("url", FORBIDDEN)
def test_metadata_vectors_refused_in_every_mode(app, url, allow):
    with app.app_context(), pytest.raises(Exception) as err:
        netguard.validate_url(url, field="target", allow_private_hosts=allow)
    assert "target" in str(err.value)


@pytest.mark.parametrize("answers", [["169.254.169.254"], ["fe80::1"], ["fd00:ec2::254"],
                                     ["::ffff:169.254.169.254"], ["127.0.0.1", "169.254.169.254"]])
def test_dns_vectors_never_reach_metadata(app, monkeypatch, answers):
    dns = dnsstub.install(monkeypatch)
    rec = StandIn()
    rec.route("*", "*", lambda req: (200, {}, {"Connection": "close"}))
    with rec as url, app.app_context():
        target = f"http://rebind.example:{int(url.rsplit(':', 1)[1])}/hook"
        dns.answers["rebind.example"] = answers
        if len(answers) > 1:  # the first (allowed) lookup connects; the rebound one must not
            assert http.call("POST", target, purpose="test", timeout=5, data=b"x").status_code == 200
        with pytest.raises(http.AddressRefused):
            http.call("POST", target, purpose="test", timeout=5, data=b"x")
    assert len(rec.requests) == (1 if len(answers) > 1 else 0)
