"""The console's dates and ranges. The activity page and its CSV download read `from`/`to` as UTC dates: a date
at the edge of the calendar (`to` = 9999-12-31, whose next day does not exist) is a form
error, like any other unusable date — it was a 500."""
from __future__ import annotations

import pytest

from tests.api.test_console_security import signed_in  # noqa: F401 - fixture
from tests.gateway_helpers import mod, provider, provider_server  # noqa: F401 - fixtures


@pytest.mark.parametrize("path", ["/activity", "/activity/export.csv"])
@pytest.mark.parametrize("query", [{"from": "9999-12-30", "to": "9999-12-31"}, {"to": "9999-12-31"},
                                   {"from": "0001-01-01", "to": "0001-01-02"}])
def test_dates_at_the_edge_of_the_calendar_are_form_errors(app, signed_in, path, query):  # noqa: F811
    client, _ = signed_in()
    r = client.get(path, query_string=query)
    if query["to"].startswith("9999"):
        assert r.status_code == 400 and b"Enter a date before 9999-12-31." in r.data, r.status_code
    else:
        assert r.status_code == 200, r.status_code


@pytest.mark.parametrize("page", ["/dashboard", "/usage"])
def test_a_range_with_calls_but_no_spend_says_no_spend_not_no_activity(app, signed_in, mod, page):  # noqa: F811
    """A refunded call is activity that cost nothing: the calls chart shows it, and the spend
    chart beside it said "No activity in this range yet." (review of 2026-11-29)."""
    from tests.gateway_helpers import call

    client, acct = signed_in()
    assert call(app.test_client(), acct, {"action": "boom"}).status_code == 502  # refunded
    html = client.get(page).get_data(as_text=True)
    assert "No activity in this range yet." not in html
    assert "No spend in this range yet" in html


def test_an_empty_activity_list_says_why_when_filters_are_set(app, signed_in):  # noqa: F811
    """The activity page said "No calls yet. Create a key and call a module" under a filter
    error (no call is read then) and under filters that match nothing, to a person whose
    calls are one click away; a refused filter also offered the CSV link that answers a 400."""
    client, _acct = signed_in()
    r = client.get("/activity?from=2026-11-30&to=2026-11-01")
    html = r.get_data(as_text=True)
    assert r.status_code == 400 and "No calls yet" not in html and 'id="export"' not in html
    assert "Correct the filters above" in html
    html = client.get("/activity?status=refunded").get_data(as_text=True)
    assert "No calls yet" not in html and "No call matches these filters" in html and 'id="export"' in html
    assert "No calls yet" in client.get("/activity").get_data(as_text=True)
