"""Issue 42 item 5: the console's forms take the JSON API's input policy (one policy,
``app.blueprints.fields``): key, alert and agent names (and review notes) with NUL, line
breaks, C1 controls or RFC 2047 encoded words are refused with the field's message and
create nothing — NUL used to be a 500 on PostgreSQL."""
from __future__ import annotations

import pytest
from sqlalchemy import func, select

from app.extensions import db
from app.models import Agent, Alert, ApiKey
from tests.agentkit import Keypair
from tests.api.test_console_security import _csrf, signed_in  # noqa: F401 - fixture

BAD = ["a\x00b", "a\r\nBcc: x@example.com", "a\x85b", "a\x1b[31m"]
ENCODED_WORD = "=?utf-8?q?hi=0ABcc:_x@example.com?="


def _count(app, model) -> int:
    with app.app_context():
        n = db.session.execute(select(func.count()).select_from(model)).scalar_one()
        db.session.remove()
        return n


def _post(client, page, action, data):
    html = client.get(page).get_data(as_text=True)
    return client.post(action, data={**data, "csrf": _csrf(html)})


@pytest.mark.parametrize("name", BAD)
def test_key_names(app, signed_in, name):
    client, _ = signed_in()
    before = _count(app, ApiKey)
    r = _post(client, "/keys", "/keys", {"name": name, "scopes": ["call:read"]})
    assert r.status_code == 400 and 'id="e-name"' in r.get_data(as_text=True)
    assert _count(app, ApiKey) == before


@pytest.mark.parametrize("name", BAD + [ENCODED_WORD])
def test_alert_names(app, signed_in, name):
    client, acct = signed_in()
    r = _post(client, "/alerts", "/alerts", {"name": name, "metric": "calls", "op": ">", "threshold": "5",
                                             "window": "hour", "channel": "email", "target": acct.email})
    assert r.status_code == 400 and 'id="e-name"' in r.get_data(as_text=True), r.get_data(as_text=True)[-600:]
    assert _count(app, Alert) == 0


@pytest.mark.parametrize("name", BAD)
def test_agent_names(app, signed_in, name):
    client, _ = signed_in()
    r = _post(client, "/agents", "/agents", {"name": name, "pubkey": Keypair().pubkey, "webhook": ""})
    assert r.status_code == 400 and 'id="e-name"' in r.get_data(as_text=True)
    assert _count(app, Agent) == 0


def test_good_values_still_work(app, signed_in):
    client, acct = signed_in()
    assert _post(client, "/agents", "/agents", {"name": "bot", "pubkey": Keypair().pubkey,
                                                "webhook": ""}).status_code == 303
    assert _post(client, "/alerts", "/alerts", {"name": "spend", "metric": "calls", "op": ">", "threshold": "5",
                                                "window": "hour", "channel": "email",
                                                "target": acct.email}).status_code == 303
    assert _count(app, Agent) == 1 and _count(app, Alert) == 1


@pytest.mark.parametrize("threshold", ["abc", "NaN", "-1", ""])
def test_an_alert_threshold_that_is_no_number_is_shown_on_its_field(app, signed_in, threshold):
    """The form's text becomes the JSON number the API schema takes (``web.form_number``);
    text that spells no number, or a refused one, is the field's error."""
    client, acct = signed_in()
    r = _post(client, "/alerts", "/alerts", {"name": "spend", "metric": "calls", "op": ">", "threshold": threshold,
                                             "window": "hour", "channel": "email", "target": acct.email})
    assert r.status_code == 400 and 'id="e-threshold"' in r.get_data(as_text=True)
    assert _count(app, Alert) == 0
