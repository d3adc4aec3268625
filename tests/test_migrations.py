"""Migrations: one baseline and one head; the migrated schema matches the models exactly;
down to an empty database and up again."""
from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from flask_migrate import downgrade, upgrade
from sqlalchemy import text

from app.extensions import db
from app.services.platform.partitions import is_partition


def include_name(name, type_, parent_names):
    return not (type_ == "table" and is_partition(name))


def _script(app) -> ScriptDirectory:
    config = app.extensions["migrate"].migrate.get_config(app.extensions["migrate"].directory)
    return ScriptDirectory.from_config(config)


def test_one_baseline_one_head(app):
    with app.app_context():
        script = _script(app)
        heads, bases = script.get_heads(), script.get_bases()
    assert len(heads) == 1 and len(bases) == 1, (heads, bases)


def test_models_match_migrations(app):
    # The session fixture built the schema by running the migrations.
    with app.app_context():
        with db.engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True,
                                                         "include_name": include_name})
            diff = compare_metadata(ctx, db.metadata)
    assert diff == [], diff


def _objects() -> list[tuple[str, str]]:
    """(kind, name) of every relation and function of the public schema."""
    with db.engine.connect() as conn:
        return conn.execute(text(
            "SELECT c.relkind::text, c.relname FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace "
            "UNION ALL SELECT 'function', p.oid::regprocedure::text FROM pg_proc p "
            "WHERE p.pronamespace = 'public'::regnamespace ORDER BY 1, 2")).all()


def test_downgrade_to_base_and_up_again(app):
    with app.app_context():
        before = _objects()
        db.session.remove()
        db.engine.dispose()  # no pooled connection may hold a lock on the tables
        try:
            downgrade(revision="base")
            left = _objects()
        finally:
            upgrade(revision="head")
        assert {name for _, name in left} <= {"alembic_version", "alembic_version_pkc"}, left
        assert _objects() == before


def _upgrade_over(app, revision: str, *statements: str) -> None:
    """Down to ``revision``, run ``statements`` there (rows stored before the next
    revisions), and up to the head again."""
    with app.app_context():
        db.session.remove()
        db.engine.dispose()  # no pooled connection may hold a lock on the tables
        try:
            downgrade(revision=revision)
            with db.engine.begin() as conn:
                for statement in statements:
                    conn.execute(text(statement))
        finally:
            upgrade(revision="head")


def test_billing_fills_saved_methods_with_each_profiles_default(app):
    """0003_billing: a default method saved before the list of saved methods existed is listed."""
    _upgrade_over(app, "money_engine",
                  "INSERT INTO accounts (id, plan, kind, is_admin, balance_micros, test_balance_micros, "
                  "created_at) VALUES ('acc_mig', 'starter', 'human', false, 0, 0, now())",
                  "INSERT INTO billing_profiles (account_id, processor, customer_id, payment_method_id, "
                  "payment_method_type, brand, last4, updated_at) VALUES "
                  "('acc_mig', 'sandbox', 'cus_1', 'pm_card_visa', 'card', 'visa', '4242', now()), "
                  "('acc_mig', 'stripe', 'cus_2', NULL, NULL, NULL, NULL, now())")
    with app.app_context():
        with db.engine.begin() as conn:
            rows = conn.execute(text("SELECT account_id, processor, payment_method_id, payment_method_type, last4 "
                                     "FROM saved_methods")).all()
            conn.execute(text("DELETE FROM saved_methods; DELETE FROM billing_profiles; DELETE FROM accounts"))
    assert [tuple(r) for r in rows] == [("acc_mig", "sandbox", "pm_card_visa", "card", "4242")]


def test_subscription_mailbox_backfilled_and_one_row_kept_per_mailbox_and_list(app):
    """0012_subscription_mailbox: rows stored before it get their canonical mailbox; of
    several rows of one mailbox on one list the most relevant stays (subscribed over pending
    over unsubscribed, then the newest) and the pending tokens of the removed ones go."""
    _upgrade_over(app, "agent_disable",
                  "INSERT INTO subscriptions (id, email, list, status, created_at) VALUES "
                  "('sub_1', 'j.doe@gmail.com', 'weekly', 'subscribed', now() - interval '3 days'), "
                  "('sub_2', 'jdoe+x@gmail.com', 'weekly', 'subscribed', now() - interval '2 days'), "
                  "('sub_3', 'jdoe@googlemail.com', 'weekly', 'pending', now() - interval '1 day'), "
                  "('sub_4', 'jdoe@gmail.com', 'launch', 'unsubscribed', now() - interval '1 day'), "
                  "('sub_5', 'j.d.o.e@gmail.com', 'launch', 'pending', now() - interval '2 days'), "
                  "('sub_6', 'farm+1@example.com', 'product', 'unsubscribed', now() - interval '2 days'), "
                  "('sub_7', 'farm@example.com', 'product', 'unsubscribed', now() - interval '1 day'), "
                  "('sub_8', 'f.arm@example.com', 'product', 'subscribed', now())",
                  "INSERT INTO single_use_tokens (token_hash, purpose, subject, expires_at, created_at) VALUES "
                  "('h3', 'newsletter_confirm', 'sub_3', now() + interval '1 day', now()), "
                  "('h5', 'newsletter_confirm', 'sub_5', now() + interval '1 day', now())")
    with app.app_context():
        with db.engine.begin() as conn:
            rows = conn.execute(text("SELECT id, email, mailbox, list, status FROM subscriptions ORDER BY id")).all()
            token_subjects = conn.execute(text("SELECT subject FROM single_use_tokens")).scalars().all()
            conn.execute(text("DELETE FROM single_use_tokens; DELETE FROM subscriptions"))
    assert [tuple(r) for r in rows] == [
        ("sub_2", "jdoe+x@gmail.com", "jdoe@gmail.com", "weekly", "subscribed"),
        ("sub_5", "j.d.o.e@gmail.com", "jdoe@gmail.com", "launch", "pending"),
        ("sub_7", "farm@example.com", "farm@example.com", "product", "unsubscribed"),
        ("sub_8", "f.arm@example.com", "f.arm@example.com", "product", "subscribed")]
    assert token_subjects == ["sub_5"]
