"""usage: the tail roll (``usage_rollup_state.tail_through``)

Readers summed the rolled hours plus every call logged since ``rolled_through``, the first
hour not rolled. An hour is rolled ``USAGE_ROLL_MARGIN_SECONDS`` after it ended, so that
tail was 5 to 65 minutes of an account's calls, aggregated on every read: with a few
thousand calls of one account in it, a usage read cost 5-14 ms of PostgreSQL instead of
~1 ms (docs/performance.md, "Usage reads"). The roll job now also adds the calls of each
settled minute to its hour's ``usage_hourly`` row and records where it stopped in
``tail_through``; readers read the call log from there (billing/usage_log.py).

Upgrade adds the nullable column (NULL: nothing rolled after ``rolled_through``, the
readers' previous behaviour). Downgrade removes the minute sums first — the rows of the
hours in [``rolled_through``, ``tail_through``), which only the tail roll writes — since
the previous code reads those hours from the call log, then drops the column.

Revision ID: usage_tail_roll
Revises: finalize_function
Create Date: 2026-11-23 08:40:00.000000
"""
import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime

revision = "usage_tail_roll"
down_revision = "finalize_function"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("usage_rollup_state") as batch_op:
        batch_op.add_column(sa.Column("tail_through", UTCDateTime(), nullable=True))


def downgrade():
    op.execute(sa.text("DELETE FROM usage_hourly WHERE hour >= (SELECT rolled_through FROM usage_rollup_state "
                       "WHERE id = 1) AND hour < (SELECT tail_through FROM usage_rollup_state WHERE id = 1)"))
    with op.batch_alter_table("usage_rollup_state") as batch_op:
        batch_op.drop_column("tail_through")
