"""Integer query parameters are ASCII decimal digits (``fields.QueryInteger``): Python's
``int()``, under marshmallow's ``Integer``, also read ``1_0``, `` 5``, ``+5`` and other
scripts' digits (``٥``) as numbers, so a malformed URL was answered as if it said something
else instead of a 400 naming the parameter."""
from __future__ import annotations

import marshmallow as ma
import pytest

from app.blueprints.fields import QueryInteger


@pytest.mark.parametrize("days", ["٥", "1_0", " 5", "5 ", "+5", "0x5", "5.0", "", "５"])
def test_a_query_integer_that_is_not_ascii_digits_is_400(client, make_account, days):
    acct = make_account()
    r = client.get("/api/usage/daily", query_string={"days": days}, headers=acct.headers)
    assert r.status_code == 400, (days, r.data)
    body = r.get_json()
    assert body["error"] == "invalid_request" and "days" in body["message"]


def test_plain_digits_still_work(client, make_account):
    acct = make_account()
    r = client.get("/api/usage/daily", query_string={"days": "5"}, headers=acct.headers)
    assert r.status_code == 200 and len(r.get_json()["days"]) == 5
    r = client.get("/api/usage/daily", query_string={"days": "-1"}, headers=acct.headers)
    assert r.status_code == 400  # digits, but out of range: the range's own message


def test_every_integer_query_parameter_is_a_query_integer(app):
    """No query schema of the API reads an integer with plain ``Integer`` (int())."""
    plain = []
    for rule in app.url_map.iter_rules():
        view = app.view_functions[rule.endpoint]
        cls = getattr(view, "view_class", None)
        handlers = [getattr(cls, m) for m in ("get", "post", "put", "patch", "delete") if hasattr(cls, m)] \
            if cls else [view]
        for handler in handlers:
            for arg in getattr(handler, "_apidoc", {}).get("arguments", {}).get("parameters", []):
                if arg.get("in") != "query":
                    continue
                schema = arg["schema"]() if isinstance(arg["schema"], type) else arg["schema"]
                plain += [f"{rule.rule} {type(schema).__name__}.{name}" for name, field in schema.fields.items()
                          if isinstance(field, ma.fields.Integer) and not isinstance(field, QueryInteger)
                          and not field.dump_only]
    assert plain == []
