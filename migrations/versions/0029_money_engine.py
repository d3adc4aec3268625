"""money engine: gw_post / gw_spend_* building blocks, payer and actor apart, the ledger guarded

Revision ID: money_engine
Revises: grouped_open_lock_wait
"""
import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime

revision = "money_engine"
down_revision = "grouped_open_lock_wait"
branch_labels = None
depends_on = None


def upgrade():
    op.add_column("ledger_transactions", sa.Column("actor", sa.String(64), nullable=True))
    for table in ("module_calls", "chat_completions"):
        op.add_column(table, sa.Column("spend_reserved_from", UTCDateTime(), nullable=True))
        op.add_column(table, sa.Column("actor", sa.String(64), nullable=True))
    op.execute("DROP FUNCTION IF EXISTS gw_chat_hold(varchar, varchar, varchar, boolean, bigint, varchar,"
               " timestamptz, varchar[], bigint[])")
    op.execute("DROP FUNCTION IF EXISTS gw_open_call")
    from app.services.money import schema
    schema.install(op.get_bind())
    op.execute("CREATE TRIGGER gw_ledger_entries_balanced AFTER INSERT ON ledger_entries "
               "REFERENCING NEW TABLE AS gw_new_entries FOR EACH STATEMENT EXECUTE FUNCTION gw_ledger_balanced()")
    for table in ("ledger_entries", "ledger_transactions"):
        op.execute(f"CREATE TRIGGER gw_{table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                   "FOR EACH STATEMENT EXECUTE FUNCTION gw_ledger_append_only()")


def downgrade():
    raise NotImplementedError("temporary")
