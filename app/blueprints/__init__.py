"""Blueprint registry: every area's blueprint is registered here, in one place.

One line per area (``<module path>``, whose ``blp`` is a flask-smorest Blueprint and
whose optional ``init_api(api)`` runs after registration), so that areas added in
parallel merge without touching each other's lines.
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
    "app.blueprints.ops.routes",
]


def register_blueprints(app: Flask, api) -> None:
    from app.blueprints.docs.routes import bp as docs_bp

    app.register_blueprint(docs_bp)
    for path in API_BLUEPRINTS:
        module = import_module(path)
        api.register_blueprint(module.blp)
        if hasattr(module, "init_api"):  # optional per-area hook (e.g. extra security schemes)
            module.init_api(api)
