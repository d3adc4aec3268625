"""metered call: the finalize as gw_finalize_calls() (PostgreSQL only)

The finalize of a group of metered calls (``gateway.charging._write_group``) was one
prepared data-modifying CTE: ``UPDATE module_calls … FROM jsonb_to_recordset(…)`` joined
on ``(id, created_at)`` with ``status = 'pending'`` and a ``created_at`` range. Its plan
was the planner's choice, made once per connection (the prepared statement's generic
plan) from the statistics of that moment. On a database without fresh statistics (a
fresh one, or autovacuum off as on the bench machine) it chose a scan of every
``pending`` entry of ``ix_module_calls_status_deadline`` (dead ones included: every call
is inserted pending) or of the whole month, hash-joined: the finalize's PostgreSQL CPU
grew with the table, from 0.3 ms to 2-3.4 ms per call within 4,000 calls
(docs/performance.md, "PostgreSQL CPU per metered call").

``gw_finalize_calls(rows jsonb)`` makes the same writes row by row with plans that cannot
degrade: each call's row is found by its primary key ``(id, created_at)`` (pruned to its
month at execution), ``status COLLATE "C" = 'pending'`` being the same test as
``status = 'pending'`` (byte equality under a deterministic collation) that no index can
serve, and ``enable_seqscan = off`` for the function's own statements so that a plan made
while a month's partition (or ``idempotency_records``) was still small is never a
sequential scan; then, for a call still pending, its key's stored response by the key's
unique index. Same effects, same answer (the ids moved to ``succeeded``), still ONE
autocommit statement whose commit waits for the WAL flush. No table or index changes.

Downgrade drops the function (the previous code runs the CTE).

Revision ID: finalize_function
Revises: chat_hold_settle_v2
Create Date: 2026-11-23 06:00:00.000000
"""
from alembic import op

revision = "finalize_function"
down_revision = "chat_hold_settle_v2"
branch_labels = None
depends_on = None

FINALIZE = r"""
CREATE OR REPLACE FUNCTION gw_finalize_calls(p_rows jsonb)
RETURNS SETOF varchar LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
    b record;
    v_id varchar;
BEGIN
    FOR b IN SELECT * FROM jsonb_to_recordset(p_rows)
                AS x(id varchar, created_at timestamptz, ok boolean, provider_status integer,
                     receipt jsonb, finished_at timestamptz, account_id varchar, idem_key varchar,
                     response_body text) LOOP
        v_id := NULL;
        UPDATE module_calls m
           SET status = 'succeeded', ok = b.ok, provider_status = b.provider_status,
               receipt = b.receipt, finished_at = b.finished_at
         WHERE m.id = b.id AND m.created_at = b.created_at AND m.status COLLATE "C" = 'pending'
        RETURNING m.id INTO v_id;
        IF v_id IS NOT NULL THEN  -- still pending (the sweep may have refunded it)
            UPDATE idempotency_records r SET status = 'done', response_body = b.response_body
             WHERE r.account_id = b.account_id AND r.key = b.idem_key AND r.call_id = b.id;
            RETURN NEXT v_id;
        END IF;
    END LOOP;
END
$fn$;
"""


def upgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute(FINALIZE)


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS gw_finalize_calls(jsonb)")
