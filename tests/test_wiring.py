"""Explicit wiring: importing ``app.auth`` starts and registers nothing (``create_app``
calls ``auth.init_app``), and every entry of the schedule imports and runs once."""
from __future__ import annotations

import subprocess
import sys

import pytest

from app import auth
from app.extensions import db
from app.tasks.schedule import SCHEDULE


def test_importing_auth_has_no_side_effects():
    code = ("import threading, app.auth as a; "
            "assert a._resolvers == {} and a._state['pid'] is None, a._resolvers; "
            "assert threading.active_count() == 1, threading.enumerate()")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_init_app_registers_every_credential_resolver(app):
    from app.services.agents.identity import SESSION_PREFIX

    assert {"svc_live_", "svc_test_", SESSION_PREFIX} <= set(auth._resolvers)


@pytest.mark.parametrize("name,interval,func", SCHEDULE, ids=[e[0] for e in SCHEDULE])
def test_every_schedule_entry_runs_once(app, name, interval, func):
    assert callable(func) and interval > 0
    with app.app_context():
        func()
        db.session.rollback()


def test_no_flask_session_is_opened_or_saved(app, client):
    """No request opens a Flask session (no cookie parsing, no serializer) or sets its
    cookie; using ``flask.session`` is an error, not a silent cookie."""
    import flask
    from flask.sessions import NullSession

    r = client.get("/api/modules", headers={"Cookie": "session=forged"})
    assert r.status_code == 200 and "Set-Cookie" not in r.headers
    with app.test_request_context("/"):
        assert isinstance(flask.session, NullSession)
        with pytest.raises(RuntimeError):
            flask.session["x"] = 1
