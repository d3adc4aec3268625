"""Console usage: a call the provider refused (``ok: false``, its 4xx, charged by the
documented rule) is shown as what it is on the usage, activity and dashboard lists and on
its page, and counted as the API's usage report counts it (a call, not an error)."""
from __future__ import annotations

import re

from tests.api.test_console_security import signed_in  # noqa: F401 - fixture
from tests.support.finalize import drain
from tests.support.stacked import split_cells
from tests.gateway_helpers import call, mod, provider, provider_server  # noqa: F401 - fixtures


def _status_cells(html: str) -> list[str]:
    return re.findall(r'<td data-label="Status"><span>(.*?)</span></td>', html, re.S)


def test_a_provider_refusal_is_not_shown_as_a_success(app, client, signed_in, mod):
    browser, acct = signed_in()
    refused = call(client, acct, {"action": "bad"}).get_json()
    assert refused["ok"] is False and refused["cost_cents"] == 2
    assert call(client, acct, {"action": "ok"}).get_json()["ok"] is True
    drain(app)  # the calls' final rows (ok, provider status, receipt) are written after the answer
    for path in ("/usage", "/activity", "/dashboard"):
        cells = _status_cells(browser.get(path).get_data(as_text=True))
        assert len(cells) == 2, path
        newest, oldest = cells
        assert '<span class="pill succeeded">succeeded</span>' in newest, path
        assert '<span class="pill refused">ok: false</span>' in oldest and "succeeded" not in oldest, path
        assert "refused by the provider (HTTP 422), charged" in oldest, path
        assert split_cells(browser.get(path).get_data(as_text=True)) == [], path
    page = browser.get(f"/usage/calls/{refused['call_id']}").get_data(as_text=True)
    assert re.search(r'<dt>Status</dt><dd><span class="pill refused">ok: false</span>', page)
    # counted as the API counts it: a call, charged, not an error
    daily = client.get("/api/usage/daily?days=1", headers=acct.headers).get_json()["days"][-1]
    assert (daily["calls"], daily["errors"]) == (2, 0)
    html = browser.get("/usage").get_data(as_text=True)
    row = re.search(r'<tr><td data-label="Product"><code>svc</code></td>.*?</tr>', html).group(0)
    assert '<td data-label="Calls" class="num">2</td><td data-label="Errors" class="num">0</td>' in row
    assert "A call the provider refused (<code>ok: false</code>, its 4xx) is charged and counts as a call, " \
           "not an error" in html


def test_a_calls_receipt_is_shown_indented(app, client, signed_in, mod):
    """The call page asks ``tojson(indent=2)``, which the app's JSON provider (orjson) ignored:
    the receipt was one line scrolling sideways (35 characters of it seen at 390 px)."""
    browser, acct = signed_in()
    done = call(client, acct, {"action": "ok"}).get_json()
    drain(app)
    page = browser.get(f"/usage/calls/{done['call_id']}").get_data(as_text=True)
    receipt = re.search(r'<pre class="json">(.*?)</pre>', page, re.S).group(1)
    assert receipt.startswith('{\n  "v": 2,\n') and '\n  "action": "ok",\n' in receipt


def test_the_activity_status_filter_says_succeeded_includes_a_refusal(app, client, signed_in, mod):
    """The status filter is the API's call status (``GET /api/usage/export``): ``succeeded``
    lists the calls the provider refused too, and its option says so."""
    browser, acct = signed_in()
    assert call(client, acct, {"action": "bad"}).get_json()["ok"] is False
    drain(app)
    html = browser.get("/activity?status=succeeded").get_data(as_text=True)
    assert '<option value="succeeded" selected>succeeded (also ok: false)</option>' in html
    assert '<span class="pill refused">ok: false</span>' in html
