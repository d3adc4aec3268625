"""Blueprint registry: every area's blueprint is registered here, in one place.

One line per flask-smorest blueprint: ``<module path>[:attribute]`` (default attribute
``blp``; the module's optional ``init_api(api)`` runs after registration), so that areas
added in parallel merge without touching each other's lines.
"""
from __future__ import annotations

from importlib import import_module

from flask import Flask

API_BLUEPRINTS = [
    "app.blueprints.accounts.routes",
    "app.blueprints.keys.routes",
    "app.blueprints.providerkeys.routes",
    "app.blueprints.alerts.routes",
    "app.blueprints.alerts.routes:pages_blp",
    "app.blueprints.gateway.routes",
    "app.blueprints.receipts.routes",
    "app.blueprints.usage.routes",
    "app.blueprints.chat.routes",
    "app.blueprints.payments.routes",
    "app.blueprints.payments.sandbox",
    "app.blueprints.wallets.routes",
    "app.blueprints.ops.routes",
    "app.blueprints.tracking.routes",
    "app.blueprints.contact.routes",
    "app.blueprints.newsletter.routes",
    "app.blueprints.newsletter.routes:pages_blp",
    "app.blueprints.signup.routes",
    "app.blueprints.signup.routes:pages_blp",
    "app.blueprints.agents.routes",
    "app.blueprints.builds.routes",
    "app.blueprints.mcp.routes",
    "app.blueprints.mcp.routes:discovery_blp",
    "app.blueprints.orgs.routes",
    "app.blueprints.orgs.routes:own_blp",
    "app.blueprints.payouts.routes",
]


def register_blueprints(app: Flask, api) -> None:
    from app.blueprints.docs.routes import bp as docs_bp

    app.register_blueprint(docs_bp)
    from app.blueprints.console import bp as console_bp  # HTML console, not in the API document

    app.register_blueprint(console_bp)
    for spec in API_BLUEPRINTS:
        path, _, attr = spec.partition(":")
        module = import_module(path)
        api.register_blueprint(getattr(module, attr or "blp"))
        if not attr and hasattr(module, "init_api"):  # optional per-area hook
            module.init_api(api)

