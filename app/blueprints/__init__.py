"""Blueprint registry: every area's blueprint is registered here, in one place."""
from __future__ import annotations

from flask import Flask


def register_blueprints(app: Flask, api) -> None:
    from app.blueprints.accounts.routes import blp as accounts_blp
    from app.blueprints.alerts.routes import blp as alerts_blp
    from app.blueprints.docs.routes import bp as docs_bp
    from app.blueprints.keys.routes import blp as keys_blp

    app.register_blueprint(docs_bp)
    for blp in (accounts_blp, keys_blp, alerts_blp):
        api.register_blueprint(blp)

    from app.blueprints.contact.routes import blp as contact_blp
    from app.blueprints.email.routes import blp as email_blp
    from app.blueprints.email.routes import pages_blp as email_pages_blp
    from app.blueprints.signup.routes import blp as signup_blp
    from app.blueprints.signup.routes import pages_blp as signup_pages_blp
    from app.blueprints.tracking.routes import blp as tracking_blp

    for blp in (tracking_blp, contact_blp, email_blp, email_pages_blp, signup_blp, signup_pages_blp):
        api.register_blueprint(blp)
