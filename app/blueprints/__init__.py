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

    if app.config.get("BENCH_PASSTHROUGH"):  # benchmark baseline only (bench/, issue 9)
        from app.blueprints.bench.routes import blp as bench_blp
        from app.services.passthrough import check_upstream

        check_upstream(app.config.get("BENCH_UPSTREAM_URL"))
        api.register_blueprint(bench_blp)
