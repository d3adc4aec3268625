"""gw_open_calls(rows jsonb): the metered call's open for a group of calls in ONE statement

``gw_open_call`` (migration 0016) opens one call per statement and refuses by RAISEing,
so PostgreSQL undoes the whole statement. Under load most of a call's PostgreSQL CPU is
the statement and transaction around the ~0.1 ms of SQL inside (protocol, executor
start, ~20 relation locks, commit; docs/performance.md, "PostgreSQL CPU per metered
call"), and that is what a group shares: the process's opens that arrive while one is
being written go together in the next statement (``charging.GroupOpener``, leader /
followers like the durable finalize's group commit).

One statement for many calls means one call's refusal must not undo the others', and
PostgreSQL has no cheap way to undo part of a statement (an ``EXCEPTION`` block per row
is a subtransaction each). So each row is checked before it writes what a refusal
would have to undo, and what it did write before a refusal is reverted by hand:

1. the Idempotency-Key: inserted, or an expired record replaced (as 0016); a key still
   held answers ``existing`` and the row writes nothing else;
2. the key's spend limit: the conditional upsert (as 0016); refused → the key's record
   written in 1. is deleted (a refused call leaves no key behind: the expired record it
   replaced counted as absent already) → ``key_spend_limit``;
3. the debits (conditional, never below zero); one refused → the debits before it are
   credited back, the spend reservation of 2. taken back and the key deleted →
   ``insufficient``;
4. the posting and the ``pending`` call row (no refusal possible after 3.).

The outcomes are those 0016 RAISEd (``uow.REFUSALS``), returned per row with the row's
``call_id``. Rows are taken in ``(account_id, idem_key)`` order (``COLLATE "C"``), so two
groups take account rows in the same order. That alone does not keep a group from
deadlocking (on key records, or with writers that lock two accounts in another order):
migration 0028 bounds a group's lock waits. An error other than these refusals (a
duplicate call id on a retry, a lock wait given up) fails the whole statement, and
``GroupOpener`` sends each of its rows alone.

``gw_open_call`` stays (the hot path no longer calls it; downgrade goes back to it).
PostgreSQL only; SQLite keeps its multi-statement path.

Revision ID: grouped_open
Revises: idempotency_fillfactor
Create Date: 2026-11-24 17:00:00.000000
"""
from alembic import op

revision = "grouped_open"
down_revision = "idempotency_fillfactor"
branch_labels = None
depends_on = None

FUNCTION = r"""
CREATE OR REPLACE FUNCTION gw_open_calls(p_rows jsonb)
RETURNS TABLE(call_id varchar, outcome text, idem_hash varchar, idem_status varchar, idem_body text)
LANGUAGE plpgsql AS $$
DECLARE
    b record;
    v_txn bigint;
    v_n integer;
    v_limit bigint;
    v_period varchar;
    v_start timestamptz;
    v_spend_key varchar;
    v_refused text;
    i integer;
    j integer;
BEGIN
    -- the finalize commit (durable) flushes this transaction's WAL before any answer
    PERFORM set_config('synchronous_commit', 'off', true);

    FOR b IN SELECT * FROM jsonb_to_recordset(p_rows)
                AS x(call_id varchar, account_id varchar, module_id integer, slug varchar,
                     action varchar, mode varchar, price bigint, charged boolean,
                     owner_agent_id varchar, idem_key varchar, req_hash varchar,
                     now timestamptz, deadline timestamptz, idem_expires timestamptz,
                     codes varchar[], amounts bigint[], spend_key varchar)
              ORDER BY x.account_id COLLATE "C", x.idem_key COLLATE "C" NULLS FIRST LOOP
        v_spend_key := NULL;
        v_refused := NULL;

        -- 1. the Idempotency-Key: new, or replacing an expired record; else hand it back
        IF b.idem_key IS NOT NULL THEN
            INSERT INTO idempotency_records AS r
                   (account_id, key, request_hash, call_id, status, created_at, expires_at)
            VALUES (b.account_id, b.idem_key, b.req_hash, b.call_id, 'in_flight', b.now, b.idem_expires)
            ON CONFLICT (account_id, key) DO UPDATE
               SET request_hash = EXCLUDED.request_hash, call_id = EXCLUDED.call_id,
                   status = 'in_flight', response_body = NULL,
                   created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
             WHERE r.expires_at <= b.now;
            GET DIAGNOSTICS v_n = ROW_COUNT;
            IF v_n = 0 THEN
                RETURN QUERY SELECT b.call_id, 'existing'::text, r.request_hash, r.status, r.response_body
                               FROM idempotency_records r
                              WHERE r.account_id = b.account_id AND r.key = b.idem_key;
                CONTINUE;
            END IF;
        END IF;

        IF b.charged THEN
            -- 2. the key's spend limit (app/services/accounts/spend.py: same periods, same
            --    conditional upsert), before any debit
            IF b.spend_key IS NOT NULL AND b.price > 0 THEN
                SELECT k.spend_limit_micros, k.spend_limit_period INTO v_limit, v_period
                  FROM api_keys k WHERE k.id = b.spend_key;
                IF v_limit IS NOT NULL AND v_period IS NOT NULL THEN
                    v_start := CASE v_period
                        WHEN 'day' THEN date_trunc('day', b.now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                        WHEN 'week' THEN date_trunc('week', b.now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                        WHEN 'month' THEN date_trunc('month', b.now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                        ELSE timestamptz '1970-01-01 00:00:00+00' END;
                    v_n := 0;
                    IF b.price <= v_limit THEN
                        INSERT INTO key_spend AS s (key_id, period_start, spent_micros)
                        VALUES (b.spend_key, v_start, b.price)
                        ON CONFLICT (key_id, period_start) DO UPDATE
                           SET spent_micros = s.spent_micros + EXCLUDED.spent_micros
                         WHERE s.spent_micros + EXCLUDED.spent_micros <= v_limit;
                        GET DIAGNOSTICS v_n = ROW_COUNT;
                    END IF;
                    IF v_n = 0 THEN
                        v_refused := 'key_spend_limit';
                    ELSE
                        v_spend_key := b.spend_key;
                    END IF;
                END IF;
            END IF;

            -- 3. the debits, conditional (never below zero); a refusal credits back the
            --    ones before it and takes back the spend reservation
            IF v_refused IS NULL THEN
                FOR i IN 1 .. coalesce(array_length(b.codes, 1), 0) LOOP
                    IF b.codes[i] LIKE 'acct:%' THEN
                        UPDATE accounts SET balance_micros = balance_micros + b.amounts[i]
                         WHERE id = substr(b.codes[i], 6)
                           AND balance_micros + b.amounts[i] >= 0;
                        IF NOT FOUND THEN
                            v_refused := 'insufficient';
                            FOR j IN 1 .. i - 1 LOOP
                                IF b.codes[j] LIKE 'acct:%' THEN
                                    UPDATE accounts SET balance_micros = balance_micros - b.amounts[j]
                                     WHERE id = substr(b.codes[j], 6);
                                END IF;
                            END LOOP;
                            IF v_spend_key IS NOT NULL THEN
                                UPDATE key_spend SET spent_micros = spent_micros - b.price
                                 WHERE key_id = v_spend_key AND period_start = v_start;
                            END IF;
                            EXIT;
                        END IF;
                    END IF;
                END LOOP;
            END IF;

            IF v_refused IS NOT NULL THEN
                IF b.idem_key IS NOT NULL THEN
                    DELETE FROM idempotency_records r
                     WHERE r.account_id = b.account_id AND r.key = b.idem_key AND r.call_id = b.call_id;
                END IF;
                RETURN QUERY SELECT b.call_id, v_refused, NULL::varchar, NULL::varchar, NULL::text;
                CONTINUE;
            END IF;

            -- 4. the posting
            INSERT INTO ledger_transactions (kind, ref, account_id, meta, created_at)
            VALUES ('module_call', 'call:' || b.call_id, b.account_id, NULL, b.now)
            RETURNING id INTO v_txn;
            INSERT INTO ledger_entries (txn_id, ledger_account, amount_micros, created_at)
            SELECT v_txn, leg.code, leg.amount, b.now
              FROM unnest(b.codes, b.amounts) AS leg(code, amount);
        END IF;

        -- 5. the pending call (the sweep refunds it after its deadline if nobody finalizes it)
        INSERT INTO module_calls (id, account_id, module_id, module_slug, action, mode, status,
                                  price_micros, charged, owner_agent_id, idempotency_key,
                                  spend_key_id, created_at, deadline_at)
        VALUES (b.call_id, b.account_id, b.module_id, b.slug, b.action, b.mode, 'pending',
                b.price, b.charged, b.owner_agent_id, b.idem_key, v_spend_key, b.now, b.deadline);

        RETURN QUERY SELECT b.call_id, 'opened'::text, NULL::varchar, NULL::varchar, NULL::text;
    END LOOP;
END
$$;
"""


def upgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute(FUNCTION)


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS gw_open_calls(jsonb)")
