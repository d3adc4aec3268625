"""Blueprint registry: every area's blueprint is registered here, in one place."""
from __future__ import annotations

from flask import Flask


def register_blueprints(app: Flask, api) -> None:
    from app.blueprints.accounts.routes import blp as accounts_blp
    from app.blueprints.alerts.routes import blp as alerts_blp
    from app.blueprints.docs.routes import bp as docs_bp
    from app.blueprints.keys.routes import blp as keys_blp
    from app.blueprints.payments.routes import blp as payments_blp
    from app.blueprints.payments.routes import sandbox_blp
    from app.blueprints.wallet.routes import blp as wallet_blp
    from app.blueprints.modules.routes import blp as modules_blp
    from app.blueprints.receipts.routes import blp as receipts_blp
    from app.blueprints.usage.routes import blp as usage_blp

    app.register_blueprint(docs_bp)
    for blp in (accounts_blp, keys_blp, alerts_blp):
        api.register_blueprint(blp)
    for blp in (payments_blp, sandbox_blp, wallet_blp, modules_blp, receipts_blp, usage_blp):
        api.register_blueprint(blp)
