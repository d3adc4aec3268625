"""drop three indexes that no query reads, written on every metered call

* ``ix_module_calls_owner_agent_id``: nothing looks calls up by the module's owner (agent
  earnings and settlements read the ledger: ``earnings:<agent>`` entries). Every call
  wrote it twice — at the insert and at the finalize, whose status change is never a HOT
  update — and on PostgreSQL once per month partition.
* ``ix_ledger_transactions_kind`` and ``ix_ledger_transactions_account_id``: every ledger
  read starts from the legs (``ledger_entries (ledger_account, created_at)``) and reaches
  the header by its primary key; ``kind`` is only ever a filter on headers found that way
  (settlements, the agents' leaderboard), and the account id on the header is a record,
  not a lookup. Every posting (call, refund, chat hold and settle, payment) wrote both.

Three fewer index insertions per metered call (of about 23) and less to store and
vacuum; on its own too small to see: ``gw_open_call`` in a pgbench loop at c=1 ran at
4,450-4,820 calls/s without them and 4,590-4,930 with them, alternating, within the
noise. Dropping an index is a catalog change: a brief ACCESS
EXCLUSIVE lock on the table, no rewrite, fine on a populated database (on the partitioned
``module_calls`` the partitions' indexes go with the parent's). Downgrade re-creates them
(on a populated database that build takes its time and blocks writes of the table).

Revision ID: drop_unread_indexes
Revises: x402_resource_url
Create Date: 2026-11-24 08:00:00.000000
"""
from alembic import op

revision = "drop_unread_indexes"
down_revision = "x402_resource_url"
branch_labels = None
depends_on = None

INDEXES = [("ix_module_calls_owner_agent_id", "module_calls", "owner_agent_id"),
           ("ix_ledger_transactions_kind", "ledger_transactions", "kind"),
           ("ix_ledger_transactions_account_id", "ledger_transactions", "account_id")]


def upgrade():
    for name, table, _ in INDEXES:
        op.drop_index(name, table_name=table)


def downgrade():
    for name, table, column in INDEXES:
        op.create_index(name, table, [column])
