"""``bench/alerts_eval.py`` runs in its own schema: the app it builds connects with
``search_path`` = ``bench_alerts``, so its TRUNCATEs never reach the application tables.
The benchmark itself never runs."""
from __future__ import annotations

import os

from sqlalchemy import text

URL = os.environ.get("DATABASE_URL", "")


def test_the_bench_app_connects_in_its_own_schema():
    from app.extensions import db
    from bench import alerts_eval

    app = alerts_eval.make_app(URL)
    with app.app_context():
        try:
            assert db.session.execute(text("SHOW search_path")).scalar() == alerts_eval.SCHEMA
        finally:
            db.session.remove()
            db.engine.dispose()
