"""Credentials and tokens are never stored or logged in plaintext: after real flows, the
full database dump and the captured logs are grepped for every secret handed out."""
from __future__ import annotations

import logging

from sqlalchemy import text

from app.extensions import db


def dump_database(app) -> str:
    """Every row of every table, as text."""
    out = []
    with app.app_context():
        for table in db.metadata.sorted_tables:
            for row in db.session.execute(text(f'SELECT * FROM "{table.name}"')):
                out.append(f"{table.name}: {tuple(row)!r}")
        db.session.remove()
    return "\n".join(out)


def test_keys_are_not_stored_or_logged(app, client, make_account, caplog):
    caplog.set_level(logging.DEBUG)
    acct = make_account()
    secrets = [acct.key]
    r = client.post("/api/keys", json={"name": "second"}, headers=acct.headers)
    secrets.append(r.get_json()["key"])
    for s in secrets:
        client.get("/api/account", headers={"Authorization": f"Bearer {s}"})
    client.get("/api/account", headers={"Authorization": "Bearer svc_live_" + "x" * 38})
    dump = dump_database(app)
    logs = caplog.text
    for s in secrets:
        assert s not in dump
        assert s not in logs
        assert s[9:] not in dump  # not even without the prefix
    assert "svc_live_" in dump  # the display prefix is stored (sanity: the dump is real)
