"""rate counters in PostgreSQL for every limit (issue 42 item 3)

* ``rate_windows``: one row per rate counter (a plan's limit per account, a key's rpm or
  tpm, a per-IP or per-mailbox throttle) with its fixed windows, counted by
  ``gw_rate_hit`` (``app/services/platform/sql/``) when there is no Redis: the embedded
  default's gunicorn workers share it. UNLOGGED (no WAL: a counter is not worth a flush; a
  crash forgets the current windows), fillfactor 50 (the counting update stays on its page).
* ``key_rate_windows`` (the per-key rpm/tpm counters of migration byok_key_controls) is
  dropped: those count in ``rate_windows`` now.

Revision ID: rate_windows
Revises: payouts
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from migrations.helpers import create_key_rate_windows

revision = "rate_windows"
down_revision = "payouts"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "rate_windows",
        sa.Column("key", sa.Text(), primary_key=True),
        sa.Column("win", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("until", sa.BigInteger(), nullable=False),
        prefixes=["UNLOGGED"],
        postgresql_with={"fillfactor": 50},
    )
    op.drop_table("key_rate_windows")


def downgrade():
    create_key_rate_windows()
    op.drop_table("rate_windows")
