"""call log and ledger legs in monthly partitions (PostgreSQL only)

``module_calls``, ``chat_completions`` and ``ledger_entries`` become tables partitioned
by RANGE (created_at), one partition per UTC month (``<table>_pYYYY_MM``) plus a DEFAULT
partition (``<table>_default``) so an insert never fails. Works on a populated database:
for each table the old one is renamed, the partitioned one created with the same columns
(``LIKE … INCLUDING DEFAULTS INCLUDING CONSTRAINTS``), a partition is created for every
month that holds rows (and the next ``AHEAD`` months), the rows are copied, the old table
dropped and its indexes and foreign keys re-created from their definitions under the same
names. The primary key becomes ``(id, created_at)`` (a partitioned table's unique
constraints must contain the partition key). What keeps the money's uniqueness global
stays on unpartitioned tables: ``ledger_transactions.ref`` (exactly-once postings,
including ``call:<id>``), ``idempotency_records (account_id, key)``; ids are random
(119 bits) or from one sequence. Details: docs/performance.md "Partitions".

``gw_create_month_partition(table, month)`` creates one month's partition (moving rows
the DEFAULT partition holds for that month, if any); the ``partitions-ensure`` job
(app/services/platform/partitions.py) calls it for the coming months.

Also (both databases): ``chat_completions (account_id, created_at)`` replaces the index on
``account_id`` alone, and ``usage_hourly (account_id, mode, hour)`` — covering the
counters on PostgreSQL — replaces ``(account_id, hour)``: the account-scoped reads.

SQLite: no partitions (the models stay plain tables).

Revision ID: partitions
Revises: chat_one_statement
Create Date: 2026-11-22 23:10:00.000000
"""
from datetime import date, datetime, timezone

from alembic import op
from sqlalchemy import text

revision = "partitions"
down_revision = "chat_one_statement"
branch_labels = None
depends_on = None

TABLES = ("module_calls", "chat_completions", "ledger_entries")
AHEAD = 3  # months created ahead (the job keeps creating them)
USAGE_INCLUDE = ["product", "calls", "errors", "spend_micros"]

CREATE_MONTH = r"""
CREATE OR REPLACE FUNCTION gw_create_month_partition(p_table text, p_month date)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    v_from timestamptz := make_timestamptz(extract(year FROM p_month)::int,
                                           extract(month FROM p_month)::int, 1, 0, 0, 0, 'UTC');
    v_to timestamptz := v_from + interval '1 month';
    v_name text := p_table || '_p' || to_char(p_month, 'YYYY_MM');
    v_default text := p_table || '_default';
BEGIN
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN false;
    END IF;
    -- two schedulers: one creates, the other finds it done
    PERFORM pg_advisory_xact_lock(hashtext('gw_create_month_partition:' || p_table));
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                   v_name, p_table);
    IF to_regclass(v_default) IS NOT NULL THEN
        -- rows that landed in DEFAULT for this month move to the new partition (ATTACH
        -- refuses while DEFAULT holds rows of its range); the lock keeps new ones out
        EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', v_default);
        EXECUTE format('WITH moved AS (DELETE FROM %I WHERE created_at >= $1 AND created_at < $2 '
                       'RETURNING *) INSERT INTO %I SELECT * FROM moved', v_default, v_name)
          USING v_from, v_to;
    END IF;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   p_table, v_name, v_from, v_to);
    RETURN true;
END
$fn$;
"""


def _months(first: date, last: date):
    y, m = first.year, first.month
    while (y, m) <= (last.year, last.month):
        yield date(y, m, 1)
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)


def _plus_months(d: date, n: int) -> date:
    y, m = divmod(d.month - 1 + n, 12)
    return date(d.year + y, m + 1, 1)


def _definitions(conn, table: str):
    """The table's secondary index definitions and foreign keys (not the primary key)."""
    indexes = conn.execute(text(
        "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i "
        "WHERE i.indrelid = CAST(:t AS regclass) AND NOT i.indisprimary ORDER BY 1"), {"t": table}).scalars().all()
    fks = conn.execute(text(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = CAST(:t AS regclass) AND contype = 'f' ORDER BY 1"), {"t": table}).all()
    seq = conn.execute(text("SELECT pg_get_serial_sequence(:t, 'id')"), {"t": table}).scalar()
    return [d.replace(" ON ONLY ", " ON ") for d in indexes], fks, seq


def _rebuild(conn, table: str, *, partitioned: bool, pk: str) -> None:
    """Replace ``table`` by a copy with the same columns, rows, indexes and foreign keys,
    partitioned by month (``partitioned``) or plain, with primary key ``pk``."""
    indexes, fks, seq = _definitions(conn, table)
    old = f"{table}_old"
    conn.execute(text(f'ALTER TABLE "{table}" RENAME TO "{old}"'))
    suffix = " PARTITION BY RANGE (created_at)" if partitioned else ""
    conn.execute(text(f'CREATE TABLE "{table}" (LIKE "{old}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS){suffix}'))
    if partitioned:
        conn.execute(text(f'CREATE TABLE "{table}_default" PARTITION OF "{table}" DEFAULT'))
        lo, hi = conn.execute(text(f'SELECT min(created_at), max(created_at) FROM "{old}"')).one()
        today = datetime.now(timezone.utc).date()
        first = min(lo.astimezone(timezone.utc).date(), today) if lo else today
        last = max(hi.astimezone(timezone.utc).date(), today) if hi else today
        for month in _months(first, _plus_months(last, AHEAD)):
            conn.execute(text("SELECT gw_create_month_partition(:t, :m)"), {"t": table, "m": month})
    conn.execute(text(f'INSERT INTO "{table}" SELECT * FROM "{old}"'))
    if seq:
        conn.execute(text(f'ALTER SEQUENCE {seq} OWNED BY "{table}".id'))
    conn.execute(text(f'DROP TABLE "{old}" CASCADE'))
    conn.execute(text(f'ALTER TABLE "{table}" ADD CONSTRAINT "pk_{table}" PRIMARY KEY ({pk})'))
    for definition in indexes:
        conn.execute(text(definition))
    for name, definition in fks:
        conn.execute(text(f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" {definition}'))
    conn.execute(text(f'ANALYZE "{table}"'))


def upgrade():
    # account-scoped reads (export, history) of chat completions: by account and time
    op.drop_index("ix_chat_completions_account_id", table_name="chat_completions")
    op.create_index("ix_chat_completions_account_created", "chat_completions", ["account_id", "created_at"])
    # usage, daily series and the alert pass read (account, mode, hour range) of the
    # rollups: on PostgreSQL an index-only scan (the counters INCLUDEd), no heap visits
    op.drop_index("ix_usage_hourly_account_hour", table_name="usage_hourly")
    op.create_index("ix_usage_hourly_account_mode_hour", "usage_hourly", ["account_id", "mode", "hour"],
                    postgresql_include=USAGE_INCLUDE)
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    conn.execute(text(CREATE_MONTH))
    for table in TABLES:
        _rebuild(conn, table, partitioned=True, pk="id, created_at")


def downgrade():
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        for table in reversed(TABLES):
            _rebuild(conn, table, partitioned=False, pk="id")
        conn.execute(text("DROP FUNCTION IF EXISTS gw_create_month_partition(text, date)"))
    op.drop_index("ix_chat_completions_account_created", table_name="chat_completions")
    op.create_index("ix_chat_completions_account_id", "chat_completions", ["account_id"])
    op.drop_index("ix_usage_hourly_account_mode_hour", table_name="usage_hourly")
    op.create_index("ix_usage_hourly_account_hour", "usage_hourly", ["account_id", "hour"])
