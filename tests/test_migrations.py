"""Migrations: one head, and the migrated schema matches the models exactly."""
from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from flask_migrate import Migrate  # noqa: F401

from app.extensions import db
from app.services.platform.partitions import is_partition


def include_name(name, type_, parent_names):
    return not (type_ == "table" and is_partition(name))


def test_single_head(app):
    with app.app_context():
        config = app.extensions["migrate"].migrate.get_config(app.extensions["migrate"].directory)
        heads = ScriptDirectory.from_config(config).get_heads()
    assert len(heads) == 1, heads


def test_models_match_migrations(app):
    # The session fixture built the schema by running the migrations.
    with app.app_context():
        with db.engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True,
                                                         "include_name": include_name})
            diff = compare_metadata(ctx, db.metadata)
    assert diff == [], diff
