"""Deferred finalize over real gunicorn (PostgreSQL): calls are answered before their rows
are written, and a graceful stop (SIGTERM, as ``systemctl stop`` / a deploy sends) writes
every queued finalization before the worker exits — no call it answered is left for the
sweep to refund."""
from __future__ import annotations


import pytest
import requests
from sqlalchemy import func, select

from app.extensions import db
from app.models import ModuleCall
from tests.gateway_helpers import balance_cents, create_module, provider, provider_server  # noqa: F401
from tests.support import finalize as finalize_helpers
from tests.support.apps import app_env, gunicorn_proc

SLOW = 3.0  # seconds each finalize statement takes in this test


@pytest.fixture
def slow_finalize(app):
    with finalize_helpers.slow_finalize(app, SLOW):
        yield


def _statuses(app, account_id) -> dict:
    with app.app_context():
        rows = db.session.execute(select(ModuleCall.status, func.count()).where(ModuleCall.account_id == account_id)
                                  .group_by(ModuleCall.status)).all()
        db.session.remove()
    return dict(rows)


def test_a_graceful_stop_writes_every_answered_call_first(app, make_account, provider, slow_finalize, ledger_clean):
    create_module(app, "drn", provider, {"ok": (2, "/ok")})
    acct = make_account(cents=100, plan="pro")
    env = {**app_env(app.config), "CALL_FINALIZE_DEFERRED": "1"}
    proc, url = gunicorn_proc(env, workers=1, grace=30, graceful_timeout=15)
    with proc:
        proc.wait_http(url + "/openapi.json", timeout=30)
        answers = [requests.post(f"{url}/v1/module/drn/call", json={"action": "ok", "i": i},
                                 headers={"Authorization": f"Bearer {acct.key}"}, timeout=10) for i in range(5)]
        assert [r.status_code for r in answers] == [200] * 5, [r.text for r in answers]
        # Answered while the writer's first statement (SLOW s) is still in PostgreSQL:
        assert _statuses(app, acct.id).get("pending", 0) >= 4
        proc.stop()  # SIGTERM: gunicorn's graceful stop; the queue needs ~2 x SLOW s more
    assert _statuses(app, acct.id) == {"succeeded": 5}
    assert balance_cents(app, acct.id) == 100 - 5 * 2
    ledger_clean()
