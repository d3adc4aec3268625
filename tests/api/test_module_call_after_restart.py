"""A PostgreSQL restart between two metered calls (every backend of the database
terminated): the next call still succeeds and charges once. The hot path's statements run
on the thread's own connection (``uow.run_one``); a restart kills it and the autocommit
pool's idle connections alike, so the one retry must land on a fresh connection.
Failed on 38551bc: 500, both attempts on dead connections."""
from __future__ import annotations

import time

from sqlalchemy import text

from app.extensions import db
from tests.gateway_helpers import balance_cents, call, mod, provider, provider_server  # noqa: F401


def _restart(app) -> int:
    with app.app_context(), db.engine.connect() as c:
        n = c.execute(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                           "AND backend_type = 'client backend'")).scalar()
        c.commit()
    time.sleep(0.3)  # the terminations land
    return n


def test_metered_call_after_a_restart(app, client, make_account, mod):  # noqa: F811
    acct = make_account(cents=1000)
    first = call(client, acct, {"action": "ok"}, key="restart-1")
    assert first.status_code == 200, first.get_json()
    price = first.get_json()["cost_cents"]
    assert _restart(app) >= 1
    again = call(client, acct, {"action": "ok"}, key="restart-2")
    assert again.status_code == 200, again.get_json()
    assert balance_cents(app, acct.id) == 1000 - 2 * price
