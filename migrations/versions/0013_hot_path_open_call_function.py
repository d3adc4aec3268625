"""hot path: gw_open_call(), the metered call's charging statement (PostgreSQL only)

One server-side function does the whole charging transaction of a module call in ONE
round trip (app/services/gateway/charging.py calls it; docs/performance.md explains it):

1. ``synchronous_commit = off`` for this transaction (the finalize commit is durable and
   flushes it, see docs/performance.md);
2. reserve the Idempotency-Key (INSERT … ON CONFLICT: an expired record is replaced, a
   live one is returned to the caller, who replays it or answers 409);
3. [per-key spend limit plug-in point, see the marked block] ;
4. the ledger posting: conditional debit of every customer leg (``acct:<id>`` moves
   ``accounts.balance_micros`` only while it stays >= 0) then the transaction and its
   entries; an uncovered debit returns ``insufficient`` (the caller rolls back, so the
   reserved key goes too);
5. the ``pending`` call row;
6. the hour's usage counter.

The legs come from Python (``calls._legs`` with ``ledger.customer(...)``), so a change of
ledger account codes (modes) needs no change here except the cached-balance branch.
SQLite keeps the multi-statement path behind the same service interface.

Revision ID: hot_path
Revises: modes
Create Date: 2026-12-01 10:00:00.000000
"""
from alembic import op

revision = "hot_path"
down_revision = "modes"
branch_labels = None
depends_on = None

OPEN_CALL = r"""
CREATE OR REPLACE FUNCTION gw_open_call(
    p_call_id varchar, p_account_id varchar, p_module_id integer, p_slug varchar,
    p_action varchar, p_mode varchar, p_price bigint, p_charged boolean,
    p_owner_agent_id varchar, p_idem_key varchar, p_req_hash varchar,
    p_now timestamptz, p_deadline timestamptz, p_idem_expires timestamptz,
    p_codes varchar[], p_amounts bigint[])
RETURNS TABLE (outcome text, idem_hash varchar, idem_status varchar, idem_body text)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_txn bigint;
    v_n integer;
    i integer;
BEGIN
    -- 1. the finalize commit (durable) flushes this transaction's WAL before any answer
    PERFORM set_config('synchronous_commit', 'off', true);

    -- 2. the Idempotency-Key: new, or replacing an expired record; else hand it back
    IF p_idem_key IS NOT NULL THEN
        INSERT INTO idempotency_records AS r
               (account_id, key, request_hash, call_id, status, created_at, expires_at)
        VALUES (p_account_id, p_idem_key, p_req_hash, p_call_id, 'in_flight', p_now, p_idem_expires)
        ON CONFLICT (account_id, key) DO UPDATE
           SET request_hash = EXCLUDED.request_hash, call_id = EXCLUDED.call_id,
               status = 'in_flight', response_body = NULL,
               created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
         WHERE r.expires_at <= p_now;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n = 0 THEN
            RETURN QUERY SELECT 'existing'::text, r.request_hash, r.status, r.response_body
                           FROM idempotency_records r
                          WHERE r.account_id = p_account_id AND r.key = p_idem_key;
            RETURN;
        END IF;
    END IF;

    IF p_charged THEN
        -- 3. PER-KEY SPEND LIMIT PLUG-IN POINT (spend.reserve, issue 16): one conditional
        --    UPDATE of the key's counter row goes here, before the debit; when it matches
        --    no row: RETURN QUERY SELECT 'key_spend_limit'::text, NULL, NULL, NULL; RETURN;
        --    (the caller rolls back and raises KeySpendLimitReached).

        -- 4. the posting: debits first (conditional, never below zero), then the entries
        FOR i IN 1 .. array_length(p_codes, 1) LOOP
            IF p_codes[i] LIKE 'acct:%' THEN
                UPDATE accounts SET balance_micros = balance_micros + p_amounts[i]
                 WHERE id = substr(p_codes[i], 6)
                   AND balance_micros + p_amounts[i] >= 0;
                IF NOT FOUND THEN
                    RETURN QUERY SELECT 'insufficient'::text, NULL::varchar, NULL::varchar, NULL::text;
                    RETURN;
                END IF;
            END IF;
        END LOOP;
        INSERT INTO ledger_transactions (kind, ref, account_id, meta, created_at)
        VALUES ('module_call', 'call:' || p_call_id, p_account_id, NULL, p_now)
        RETURNING id INTO v_txn;
        INSERT INTO ledger_entries (txn_id, ledger_account, amount_micros, created_at)
        SELECT v_txn, leg.code, leg.amount, p_now
          FROM unnest(p_codes, p_amounts) AS leg(code, amount);
    END IF;

    -- 5. the pending call (the sweep refunds it after p_deadline if nobody finalizes it)
    INSERT INTO module_calls (id, account_id, module_id, module_slug, action, mode, status,
                              price_micros, charged, owner_agent_id, idempotency_key,
                              created_at, deadline_at)
    VALUES (p_call_id, p_account_id, p_module_id, p_slug, p_action, p_mode, 'pending',
            p_price, p_charged, p_owner_agent_id, p_idem_key, p_now, p_deadline);

    -- 6. the hour's usage counter
    INSERT INTO usage_hourly AS u (account_id, product, mode, hour, calls, errors, spend_micros)
    VALUES (p_account_id, p_slug, p_mode, date_trunc('hour', p_now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
            1, 0, p_price)
    ON CONFLICT (account_id, product, mode, hour) DO UPDATE
       SET calls = u.calls + 1, spend_micros = u.spend_micros + EXCLUDED.spend_micros;

    RETURN QUERY SELECT 'opened'::text, NULL::varchar, NULL::varchar, NULL::text;
END
$fn$;
"""


def upgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute(OPEN_CALL)


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS gw_open_call(varchar, varchar, integer, varchar, varchar, "
                   "varchar, bigint, boolean, varchar, varchar, varchar, timestamptz, timestamptz, "
                   "timestamptz, varchar[], bigint[])")
