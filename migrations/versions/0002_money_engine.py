"""money engine: payer and actor apart, spend reservations remember their period, the ledger
guarded by the database

* ``actor`` on ``ledger_transactions``, ``module_calls`` and ``chat_completions``: who acted
  (an API key or session id); ``account_id`` stays the account that pays.
* ``spend_reserved_from`` on ``module_calls`` and ``chat_completions``: the start of the
  spend-limit period the reservation was counted in, so its release goes back there even
  after the key's period changed (``gw_spend_release``).
* Triggers (their functions are ``app/services/money/sql/gw_ledger_*.sql``): every INSERT
  into ``ledger_entries`` must balance per transaction; no UPDATE or DELETE of ledger rows.
  The balance CHECKs on ``accounts`` are in the baseline.

The engine's functions come from their files (``app/sqlfunctions.py``); the trigger
functions must exist before the triggers, so this migration installs them first (the
upgrade installs every file again at the end, ``migrations/env.py``).

Revision ID: money_engine
Revises: baseline
"""
import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime
from migrations.helpers import create_append_only_trigger, drop_append_only_trigger

revision = "money_engine"
down_revision = "baseline"
branch_labels = None
depends_on = None

_LEDGER = ("ledger_entries", "ledger_transactions")


def upgrade():
    op.add_column("ledger_transactions", sa.Column("actor", sa.String(64), nullable=True))
    for table in ("module_calls", "chat_completions"):
        op.add_column(table, sa.Column("spend_reserved_from", UTCDateTime(), nullable=True))
        op.add_column(table, sa.Column("actor", sa.String(64), nullable=True))
    from app import sqlfunctions

    sqlfunctions.install(op.get_bind(), ["gw_ledger_balanced", "gw_ledger_append_only"])
    op.execute("CREATE TRIGGER gw_ledger_entries_balanced AFTER INSERT ON ledger_entries "
               "REFERENCING NEW TABLE AS gw_new_entries "
               "FOR EACH STATEMENT EXECUTE FUNCTION gw_ledger_balanced()")
    for table in _LEDGER:
        create_append_only_trigger(table)


def downgrade():
    for table in _LEDGER:
        drop_append_only_trigger(table)
    op.execute("DROP TRIGGER IF EXISTS gw_ledger_entries_balanced ON ledger_entries")
    for table in ("module_calls", "chat_completions"):
        op.drop_column(table, "actor")
        op.drop_column(table, "spend_reserved_from")
    op.drop_column("ledger_transactions", "actor")
