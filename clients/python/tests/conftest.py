"""Fixtures of the client's tests: ONE real gunicorn server of the project for the whole
session, with the demo catalog loaded and the demo provider and demo LLM running in this
process; accounts are seeded through the app's services.

The server and the seeding share a database of their own, ``<test database>_client`` next
to the one of DATABASE_URL (per xdist worker: ``gateway_ci_gw0_client``…), migrated once
per session; REDIS_URL is honoured as in tests/conftest.py. Not the project's test
database: the project's tests empty that one after each of theirs (tests/conftest.py),
and ``make test`` runs them in any order beside these on the same worker, which would
take the session's catalog away from under the server (and its snapshots cached for
``CATALOG_CACHE_TTL``). This directory's tests leave their rows for the session, as one
client's life on one deployment.

Collected by `make test` from the repository root (this directory has no __init__.py,
so its modules are imported by their unique basenames: every test file is
``test_client_*.py``). The project's ``tests`` package must be importable (run pytest
from the repository root).

``needs_issue16`` marks tests of endpoints and fields the agents-and-keys issue adds;
each also carries a ``skipif`` on the server's OpenAPI document, so they run as soon as
the server offers what they test.
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

from demo import provider as demo
from demo.llm import DemoLLMHandler
from tests.conftest import base_config, ledger_clean, make_account, migrated_app  # noqa: F401 - fixtures
from tests.support import workers
from tests.support.apps import ROOT, app_env, gunicorn
from tests.support.procs import free_port
from tests.support.standin import serve as http_server

AGENT_SESSION_TTL = 8  # seconds: short, so the re-sign before expiry is observable
X402_PAY_TO = "0x000000000000000000000000000000000000f402"


@functools.lru_cache(maxsize=1)
def _openapi() -> dict:
    """The OpenAPI document the server under test serves (built from the same code)."""
    from app import create_app

    return create_app(base_config()).test_client().get("/openapi.json").get_json()


def openapi_has(path_pattern: str, schema_field: tuple[str, str] | None = None) -> bool:
    """True when the server documents a path matching ``path_pattern`` (regex, full match)
    and, when given, ``schema_field`` = (schema name, property name)."""
    spec = _openapi()
    if not any(re.fullmatch(path_pattern, p) for p in spec["paths"]):
        return False
    if schema_field is None:
        return True
    schema = spec["components"]["schemas"].get(schema_field[0], {})
    return schema_field[1] in schema.get("properties", {})


def needs_issue16(path_pattern: str, schema_field: tuple[str, str] | None = None):
    """Marks: ``needs_issue16`` plus a skip while the server lacks the path/field."""
    missing = not openapi_has(path_pattern, schema_field)
    what = path_pattern + (f" / {schema_field[0]}.{schema_field[1]}" if schema_field else "")
    skip = pytest.mark.skipif(missing, reason=f"server's OpenAPI lacks {what} (issue 16)")
    return lambda test: pytest.mark.needs_issue16(skip(test))


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Server:
    url: str
    env: dict


def _database_url() -> str:
    return workers.database_url(os.environ["DATABASE_URL"], "client")


@pytest.fixture(scope="session")
def app():
    """The app on this session's client database (see the module docstring), migrated:
    ``make_account`` and ``ledger_clean`` seed and check through it, the server serves it."""
    return migrated_app(_database_url())


@pytest.fixture(scope="session")
def server(app) -> Iterator[Server]:  # noqa: ARG001 - the database, migrated
    provider = make_server("127.0.0.1", 0, demo.app, server_class=demo._ThreadingServer,
                           handler_class=_Quiet)
    threading.Thread(target=provider.serve_forever, daemon=True).start()
    try:
        with http_server(DemoLLMHandler) as llm_url:
            env = app_env(base_config(SQLALCHEMY_DATABASE_URI=_database_url()))
            env.update({"DEMO_PROVIDER_URL": f"http://127.0.0.1:{provider.server_address[1]}",
                        "DEMO_LLM_BASE_URL": llm_url + "/v1", "X402_PAY_TO": X402_PAY_TO,
                        "AGENT_SESSION_TTL_SECONDS": str(AGENT_SESSION_TTL)})
            for name in ("CHAT_CATALOG", "CHAT_HOST"):
                env.pop(name, None)
            subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "catalog", "load"],
                           cwd=ROOT, env=env, check=True, capture_output=True)
            port = free_port()  # BASE_URL is the server's own origin: SIWX challenges are bound to it
            env["BASE_URL"] = f"http://127.0.0.1:{port}"
            with gunicorn(env, workers=1, port=port) as url:
                yield Server(url, env)
    finally:
        provider.shutdown()
        provider.server_close()


@pytest.fixture
def gw_factory(server):
    """``gw_factory(key, **kw)``: a Gateway on the server, closed after the test."""
    from gateway_client import Gateway

    made = []

    def make(key: str | None, **kw) -> Gateway:
        g = Gateway(api_key=key, base_url=kw.pop("base_url", server.url), **kw)
        made.append(g)
        return g

    yield make
    for g in made:
        g.close()


@pytest.fixture
def funded(make_account, gw_factory):  # noqa: F811
    """A starter account with 500 cents and a full-scope key, and its Gateway."""
    acct = make_account(cents=500)
    return acct, gw_factory(acct.key)
