"""module calls: partial indexes on the pending calls only

``ix_module_calls_status_deadline (status, deadline_at)`` indexed every call, twice (the
insert as ``pending`` and the finalize's non-HOT update to ``succeeded``/``refunded``),
for the only queries that filter the log by status — all of them on ``pending``:

* the usage roll's ``SELECT min(created_at) FROM module_calls WHERE status = 'pending'``
  (``billing.usage_log._settled_before``: the oldest call that may still change). With
  no partial index the planner may answer it by walking ``ix_module_calls_created_at`` in
  order until a pending row turns up (it estimates a status value at 0.5 % of the rows
  when it has no statistics, so expects to stop after ~200 rows); when no call is
  pending it reads every row of the log: 2.4-5.3 s per roll at 10M calls on the bench
  (docs/performance.md, "Usage-roll stalls");
* the sweep's ``status = 'pending' AND deadline_at < now() ORDER BY deadline_at``;
* the retention job's "does this month still hold an unfinished call" test.

Two partial indexes ``WHERE status = 'pending'`` replace it: ``ix_module_calls_pending_created
(created_at)`` — the roll's min() is the first live entry of it — and
``ix_module_calls_pending_deadline (deadline_at)`` for the sweep. They hold only the calls
in flight (plus dead entries until vacuum), and the finalize's update adds no entry to
either (its new row is not pending). The finalize and the refund find a row by its primary
key (``gw_finalize_calls`` tests ``status COLLATE "C"``, which no index serves).

Works on a populated database without blocking writes for the build (PostgreSQL): each
index is created ``ON ONLY`` the partitioned table (invalid until every partition has
its index), then built ``CONCURRENTLY`` on every partition and attached; partitions
created later get it from the parent. The old index is dropped last (a catalog change:
a short ACCESS EXCLUSIVE lock). SQLite: plain partial indexes.

Downgrade re-creates ``ix_module_calls_status_deadline`` and drops the two.

Revision ID: pending_call_indexes
Revises: usage_tail_roll
Create Date: 2026-11-23 17:00:00.000000
"""
from alembic import op
from sqlalchemy import text

revision = "pending_call_indexes"
down_revision = "usage_tail_roll"
branch_labels = None
depends_on = None

PENDING = "status = 'pending'"
INDEXES = {"ix_module_calls_pending_created": ("created_at", "pending_created"),
           "ix_module_calls_pending_deadline": ("deadline_at", "pending_deadline")}


def _partitions(conn) -> list[str]:
    return conn.execute(text("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                             "WHERE i.inhparent = 'module_calls'::regclass ORDER BY 1")).scalars().all()


def upgrade():
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        for name, (column, _) in INDEXES.items():
            op.create_index(name, "module_calls", [column], sqlite_where=text(PENDING))
        op.drop_index("ix_module_calls_status_deadline", table_name="module_calls")
        return
    for name, (column, _) in INDEXES.items():
        conn.execute(text(f'CREATE INDEX IF NOT EXISTS "{name}" ON ONLY module_calls ({column}) WHERE {PENDING}'))
    parts = _partitions(conn)
    with op.get_context().autocommit_block():  # CONCURRENTLY runs outside a transaction
        for part in parts:
            for name, (column, suffix) in INDEXES.items():
                child = f"{part}_{suffix}"
                conn.execute(text(f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{child}" ON "{part}" ({column}) '
                                  f"WHERE {PENDING}"))
                attached = conn.execute(text(
                    "SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(:c) AND inhparent = to_regclass(:p)"),
                    {"c": child, "p": name}).first()
                if attached is None:
                    conn.execute(text(f'ALTER INDEX "{name}" ATTACH PARTITION "{child}"'))
    op.drop_index("ix_module_calls_status_deadline", table_name="module_calls")


def downgrade():
    op.create_index("ix_module_calls_status_deadline", "module_calls", ["status", "deadline_at"])
    for name in INDEXES:
        op.drop_index(name, table_name="module_calls")
