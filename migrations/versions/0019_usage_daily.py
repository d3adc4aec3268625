"""usage_daily: daily rollups of usage_hourly for the fully rolled days

``usage_daily`` (account_id, product, mode, day, calls, errors, spend_micros), unique per
(account, product, mode, day), with ``(account_id, mode, day)`` covering the counters on
PostgreSQL like ``usage_hourly``'s; ``usage_hourly (hour)`` (covering on PostgreSQL) for
reads of a few hours of every account. ``usage_rollup_state.days_rolled_through``: the first
day (00:00 UTC) not rolled into ``usage_daily`` — the day of ``rolled_through``. Readers
take the whole days of a window from ``usage_daily`` (billing/usage_log.py).

Works on a populated database: the upgrade backfills ``usage_daily`` from the
``usage_hourly`` rows of the days before the day of the mark (one INSERT … SELECT … GROUP
BY); the downgrade drops the table and the column (``usage_hourly`` still holds every hour).

Revision ID: usage_daily
Revises: partitions
Create Date: 2026-11-23 00:30:00.000000
"""
from datetime import timezone

import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime

revision = "usage_daily"
down_revision = "partitions"
branch_labels = None
depends_on = None


COUNTERS = ["product", "calls", "errors", "spend_micros"]


def _day_sql(dialect: str) -> str:
    """00:00 UTC of ``hour``, as the dialect stores a UTCDateTime (SQLite: naive text)."""
    if dialect == "postgresql":
        return "date_trunc('day', hour AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
    return "substr(hour, 1, 10) || ' 00:00:00.000000'"


def upgrade():
    op.create_table(
        "usage_daily",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("product", sa.String(length=96), nullable=False),
        sa.Column("mode", sa.String(length=8), nullable=False),
        sa.Column("day", UTCDateTime(), nullable=False),
        sa.Column("calls", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("spend_micros", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_daily")),
        sa.UniqueConstraint("account_id", "product", "mode", "day", name="uq_usage_daily_key"))
    op.create_index("ix_usage_daily_account_mode_day", "usage_daily", ["account_id", "mode", "day"],
                    postgresql_include=COUNTERS)
    # the hours of a few days for every account at once (the split days of the alert pass,
    # rolling a day): a range of this index instead of a scan of every account's rows
    op.create_index("ix_usage_hourly_hour", "usage_hourly", ["hour"],
                    postgresql_include=["account_id", "product", "mode", "calls", "errors", "spend_micros"])
    with op.batch_alter_table("usage_rollup_state") as batch_op:
        batch_op.add_column(sa.Column("days_rolled_through", UTCDateTime(), nullable=True))
    bind = op.get_bind()
    mark = bind.execute(sa.text("SELECT rolled_through FROM usage_rollup_state WHERE id = 1")
                        .columns(rolled_through=UTCDateTime())).scalar()
    if mark is None:
        return
    day = mark.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    param = sa.bindparam("d", day, type_=UTCDateTime())
    op.execute(sa.text("UPDATE usage_rollup_state SET days_rolled_through = :d WHERE id = 1").bindparams(param))
    op.execute(sa.text(f"""
        INSERT INTO usage_daily (account_id, product, mode, day, calls, errors, spend_micros)
        SELECT account_id, product, mode, {_day_sql(bind.dialect.name)}, sum(calls), sum(errors),
               sum(spend_micros)
        FROM usage_hourly WHERE hour < :d
        GROUP BY account_id, product, mode, {_day_sql(bind.dialect.name)}""").bindparams(param))


def downgrade():
    with op.batch_alter_table("usage_rollup_state") as batch_op:
        batch_op.drop_column("days_rolled_through")
    op.drop_index("ix_usage_hourly_hour", table_name="usage_hourly")
    op.drop_index("ix_usage_daily_account_mode_day", table_name="usage_daily")
    op.drop_table("usage_daily")
