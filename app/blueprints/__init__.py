"""Blueprint registry: every area's blueprint is registered here, in one place.

One line per area (``<module path>``, whose ``blp`` is a flask-smorest Blueprint), so
that areas added in parallel merge without touching each other's lines.
"""
from __future__ import annotations

from importlib import import_module

from flask import Flask

API_BLUEPRINTS = [
    "app.blueprints.accounts.routes",
    "app.blueprints.keys.routes",
    "app.blueprints.alerts.routes",
    "app.blueprints.modules.routes",
    "app.blueprints.receipts.routes",
    "app.blueprints.usage.routes",
    "app.blueprints.chat.routes",
    "app.blueprints.payments.routes",
    "app.blueprints.payments.sandbox",
    "app.blueprints.wallet.routes",
]


def register_blueprints(app: Flask, api) -> None:
    from app.blueprints.docs.routes import bp as docs_bp

    app.register_blueprint(docs_bp)
    for path in API_BLUEPRINTS:
        api.register_blueprint(import_module(path).blp)
