-- gw_open_calls(rows jsonb, lock_wait_ms integer): the metered call's open, for a group of
-- calls in ONE statement. Per row, in (account_id, idem_key) order: the Idempotency-Key
-- (new, or an expired record replaced; a live one answers 'existing'), the key's spend
-- limit (same periods and conditional upsert as app/services/accounts/spend.py), the
-- conditional debits (never below zero), the ledger posting and the 'pending' call row.
-- A refused row ('key_spend_limit', 'insufficient') reverts by hand what it wrote and the
-- other rows go on. Each lock wait lasts at most lock_wait_ms (0: no limit); the
-- statement then fails with nothing committed.
-- Called by app/services/gateway/charging.py (open_pg, GroupOpener).

CREATE OR REPLACE FUNCTION gw_open_calls(p_rows jsonb, p_lock_wait_ms integer)
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
    -- a group waits for a row lock at most this long (then its rows go one by one)
    IF p_lock_wait_ms > 0 THEN
        PERFORM set_config('lock_timeout', p_lock_wait_ms || 'ms', true);
    END IF;

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
