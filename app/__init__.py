"""Application factory: config → extensions → blueprints → errors → request id → CLI."""
from __future__ import annotations

import logging
import os

from flask import Flask
from flask.sessions import SessionInterface
from werkzeug.middleware.proxy_fix import ProxyFix

from config import load_config


class NoFlaskSession(SessionInterface):
    """The service keeps no Flask ``session``: API callers send credentials, the console
    has its own session cookie (``app.auth``). Flask's default interface would build an
    itsdangerous serializer on every request to look for a cookie nobody sets; this one
    hands out Flask's ``NullSession``, so any use of ``flask.session`` fails loudly."""

    def open_session(self, app, request):  # noqa: ARG002 - Flask's interface
        return None  # Flask then uses make_null_session(): a NullSession

    def save_session(self, app, session, response):  # noqa: ARG002 - nothing to save
        return None


def create_app(overrides: dict | None = None) -> Flask:
    app = Flask(__name__, static_folder=None)
    app.session_interface = NoFlaskSession()
    app.config.from_mapping(load_config(overrides))
    app.instance_path = app.config["INSTANCE_PATH"]
    os.makedirs(app.instance_path, exist_ok=True)

    from app.jsonutil import OrjsonProvider

    app.json = OrjsonProvider(app)
    app.json_provider_class = OrjsonProvider
    from app.logs import init_logging

    init_logging(app)

    from app.extensions import db, make_api, migrate

    db.init_app(app)
    from app.services.platform import dbpool

    dbpool.init_app(app)
    migrate.init_app(app, db, directory=os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "migrations")),
                     render_as_batch=True, compare_type=True)
    api = make_api()  # one per app: the document it serves is this app's
    api.init_app(app)
    api.spec.components.security_scheme(
        "bearerAuth",
        {"type": "http", "scheme": "bearer",
         "description": "`svc_live_…`, `svc_test_…` API keys or `svc_sess_…` agent sessions."},
    )
    from app import auth

    api.spec.components.security_scheme(
        auth.API_KEY_HEADER_SCHEME,
        {"type": "apiKey", "in": "header", "name": "x-api-key",
         "description": "Anthropic's credential header, taken by `POST /v1/messages` as an alternative to "
                        "the bearer: the same `svc_…` keys (the bearer wins when both are sent)."},
    )

    from app.converters import IdConverter, TextConverter

    # the input policy of path parameters (app/converters.py): the default converter too
    for name, conv in (("id", IdConverter), ("default", TextConverter), ("string", TextConverter)):
        app.url_map.converters[name] = conv
    for conv in (IdConverter, TextConverter):
        api.register_converter(conv, conv.schema)

    auth.init_app(app)

    from app.blueprints import register_blueprints

    register_blueprints(app, api)

    from app.errors import error_codes, register_error_handlers

    register_error_handlers(app)
    # The stable error codes, generated from the DomainError subclasses of every module.
    app.extensions["error_codes"] = codes = error_codes()
    api.spec.options["x-error-codes"] = {code: {"status": s, "description": d}
                                         for code, (s, d) in codes.items()}

    from app.requestid import init_request_id

    init_request_id(app)

    from app.metrics import init_metrics

    init_metrics(app)

    from app import telemetry

    telemetry.init_app(app)  # OpenTelemetry, only when OTEL_* ask for it

    from app.blueprints.gateway import hotpath

    hotpath.install(app)  # the metered call's thin entry in front of Flask
    if app.config["TRUSTED_PROXIES"]:  # outermost: every entry sees the client's address
        n = int(app.config["TRUSTED_PROXIES"])
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=n, x_proto=n, x_host=n)

    from app.cli import register_cli

    register_cli(app)
    logging.getLogger(__name__).debug("app created (%s)", app.config["APP_ENV"])
    return app
