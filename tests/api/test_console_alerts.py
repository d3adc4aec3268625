"""Console alerts: the threshold in its metric's unit (spend in dollars, as every money field
of the console), shown with it in the rules and the firings, and Delete asking first."""
from __future__ import annotations

import re

from sqlalchemy import select

from app.extensions import db
from app.models import Alert, AlertEvent
from tests.api.test_console_security import _csrf, signed_in  # noqa: F401 - fixture
from tests.support.stacked import split_cells


def _create(client, acct, **fields):
    page = client.get("/alerts").get_data(as_text=True)
    data = {"name": "daily spend", "metric": "spend_cents", "op": ">=", "threshold": "5", "window": "day",
            "channel": "email", "target": acct.email, **fields}
    return client.post("/alerts", data={**data, "csrf": _csrf(page)})


def _thresholds(app):
    with app.app_context():
        out = [(a.metric, a.threshold) for a in db.session.execute(select(Alert).order_by(Alert.created_at)).scalars()]
        db.session.remove()
    return out


def test_a_spend_threshold_is_typed_and_shown_in_dollars(app, signed_in):
    """"5" on a spend rule is five dollars (the API's 500 cents; it was 5 cents, with no unit
    on the form or in the list); other metrics keep their unit, named on the form."""
    client, acct = signed_in()
    page = client.get("/alerts").get_data(as_text=True)
    assert '<option value="spend_cents" selected>spend (USD)</option>' in page
    assert '<option value="calls">calls (count)</option>' in page and "error rate (%)" in page
    assert re.search(r'id="f-threshold"[^>]*>\s*<small class="hint">In the metric(?:&#39;|\')s unit: spend in dollars', page)
    assert _create(client, acct).status_code == 303
    assert _create(client, acct, name="fine", threshold="$2.505").status_code == 400  # 2 decimals at most
    assert _create(client, acct, name="cents", threshold="0.29").status_code == 303
    assert _create(client, acct, name="many calls", metric="calls", threshold="1000").status_code == 303
    assert _create(client, acct, name="errors", metric="error_rate", op=">", threshold="2.5").status_code == 303
    assert _thresholds(app) == [("spend_cents", 500.0), ("spend_cents", 29.0), ("calls", 1000.0),
                                ("error_rate", 2.5)]
    page = client.get("/alerts").get_data(as_text=True)
    conditions = re.findall(r'<td data-label="Condition"><span>(.*?)</span></td>', page)
    assert conditions == ["spend &gt;= <strong>$5.00</strong> per day", "spend &gt;= <strong>$0.29</strong> per day",
                          "calls &gt;= <strong>1,000</strong> per day", "error rate &gt; <strong>2.5%</strong> per day"]


def test_a_spend_threshold_that_is_no_dollar_amount_is_refused_on_its_field(app, signed_in):
    client, acct = signed_in()
    for typed in ("2.505", "-1", "1e3", "five"):
        r = _create(client, acct, threshold=typed)
        text = r.get_data(as_text=True)
        assert r.status_code == 400 and 'id="e-threshold"' in text and "Enter the spend in dollars" in text, typed
        assert f'value="{typed}"' in text
    assert _thresholds(app) == []


def test_a_firing_shows_its_value_and_threshold_in_the_unit(app, signed_in):
    """The firings list wrote the API's cents bare ("(spend_cents > 0.0)", value "250.5")."""
    client, acct = signed_in()
    assert _create(client, acct, op=">", threshold="2").status_code == 303
    with app.app_context():
        alert = db.session.execute(select(Alert)).scalar_one()
        db.session.add(AlertEvent(id="alev_console1", alert_id=alert.id, account_id=alert.account_id,
                                  name=alert.name, metric=alert.metric, op=alert.op, threshold=alert.threshold,
                                  value=250.5, window=alert.window, channel=alert.channel, period_key="2026-11-29"))
        db.session.commit()
        db.session.remove()
    page = client.get("/alerts").get_data(as_text=True)
    assert "daily spend <small class=\"muted\">(spend &gt; $2.00)</small>" in page
    assert '<td data-label="Value" class="num">$2.505</td>' in page
    # at 390 px each cell's content is one piece beside its label (the amount fell under
    # "Condition", the address under "Channel", the attempts under "Delivery")
    assert split_cells(page) == []


def test_deleting_an_alert_asks_first(app, signed_in):
    """Delete stops a rule for good: its form asks (console.js's ``form[data-confirm]``, the
    mechanism of Revoke and Disable), and the page loads the script that asks."""
    client, acct = signed_in()
    assert _create(client, acct).status_code == 303
    page = client.get("/alerts").get_data(as_text=True)
    form = re.search(r'<form[^>]*action="/alerts/[^"]+/delete"[^>]*>', page, re.S).group(0)
    question = re.search(r'data-confirm="([^"]+)"', form).group(1)
    assert "Delete alert “daily spend”" in question and "cannot be undone" in question
    assert re.search(r'<script src="/console/static/console\.js[^"]*" defer>', page)


def test_a_rule_whose_address_must_confirm_says_so(app, signed_in):
    """An e-mail target other than the account's own address gets nothing until it confirms
    (``alert_targets``); the list showed such a rule as any other."""
    client, acct = signed_in()
    assert _create(client, acct, name="to finance", target="finance@example.com").status_code == 303
    assert _create(client, acct, name="to me").status_code == 303
    page = client.get("/alerts").get_data(as_text=True)
    channels = re.findall(r'<td data-label="Channel"><span>(.*?)</span></td>', page, re.S)
    assert len(channels) == 2
    assert "finance@example.com</span><br><small class=\"muted\">not sent until this address confirms (we " \
           "e-mailed it a link, valid 7 days)</small>" in channels[0]
    assert "confirms" not in channels[1]
