"""Open redirects (finding 2): a checkout's return_url with userinfo, backslashes, a
non-https scheme (in production) or a host outside RETURN_URL_HOSTS is refused: 400 when
it breaks the published pattern, 422 ``unprocessable`` when only the configuration refuses
a URL of the documented shape (docs/decisions.md "Schema-valid requests");
a stored unsafe URL is never redirected to; the hosted checkout page sends the HTML
security headers."""
from __future__ import annotations

from urllib.parse import urlparse

import pytest

from app import pages
from app.extensions import db
from app.models import Payment

VECTORS = [
    "https://trusted.example@evil.example/login",
    "https://trusted.example:pw@evil.example/",
    "https://@evil.example/",
    "https://trusted.example\\@evil.example/",
    "https:\\\\evil.example/",
    "https://evil.example\\.trusted.example/",
    "javascript:alert(1)//https://x",
    "data:text/html,<script>alert(1)</script>",
    "//evil.example/",
    "/relative/path",
    "https://exa mple.com/",
    "https://example.com/\r\nLocation: https://evil.example/",
    "https:///nohost",
    "ftp://example.com/",
]


@pytest.mark.parametrize("url", VECTORS + ["http://shop.example/return"])
def test_return_url_vectors_refused(client, account, monkeypatch, app, url):
    monkeypatch.setitem(app.config, "PRODUCTION", True)  # http refused only in production
    r = client.post("/api/pay/checkout", json={"amount_cents": 500, "return_url": url}, headers=account.headers)
    from app.blueprints.payments.schemas import _RETURN_URL

    documented = _RETURN_URL.regex.fullmatch(url) is not None  # http in production: configuration
    expected = (422, "unprocessable") if documented else (400, "invalid_request")
    assert (r.status_code, r.get_json()["error"]) == expected, (url, r.get_json())
    assert "return_url" in r.get_json()["message"]


@pytest.mark.parametrize("url,ok", [("https://shop.example/back", True), ("https://a.shop.example/", True),
                                    ("https://evil.example/", False), ("https://shop.example.evil.example/", False)])
def test_return_url_host_allow_list(client, account, monkeypatch, app, url, ok):
    monkeypatch.setitem(app.config, "RETURN_URL_HOSTS", "shop.example")
    r = client.post("/api/pay/checkout", json={"amount_cents": 500, "return_url": url}, headers=account.headers)
    assert r.status_code == (200 if ok else 422), r.get_json()


@pytest.mark.parametrize("stored", VECTORS[:6])
def test_stored_unsafe_url_never_redirected_and_page_headers(app, client, account, stored):
    r = client.post("/api/pay/checkout", json={"amount_cents": 500, "return_url": "https://shop.example/b"},
                    headers=account.headers)
    out = r.get_json()
    path = urlparse(out["url"]).path
    page = client.get(path)
    for name, value in pages.HEADERS.items():
        if name != "Content-Security-Policy":
            assert page.headers[name] == value
    csp = page.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp and "form-action 'self' https://shop.example" in csp
    with app.app_context():  # a row stored before the rule existed
        db.session.get(Payment, out["payment_id"]).return_url = stored
        db.session.commit()
    r = client.post(path, data={"action": "cancel"})
    assert r.status_code == 200 and "Location" not in r.headers
    assert stored.encode() not in r.data and r.headers["X-Frame-Options"] == "DENY"


def test_a_return_url_with_userinfo_is_refused_saying_so(client, account):
    """The schema's pattern refuses it first; its message names the rule, as the service's did."""
    r = client.post("/api/pay/checkout", json={"amount_cents": 500, "return_url": "https://user@shop.example/"},
                    headers=account.headers)
    assert r.status_code == 400 and "return_url" in r.get_json()["message"]
    assert "userinfo" in r.get_json()["message"], r.get_json()
