-- gw_open_calls(rows, lock_wait_ms): the metered call's open (charge) for a group of calls
-- in ONE autocommit statement. Called by app/services/money/charging.py (GroupOpener: the
-- opens of one process that arrive while one is being written share the next statement).
--
-- Per row, in payer order ((account_id, idem_key), COLLATE "C", so two groups take account
-- rows in the same order), each row answered its own outcome:
--   1. the Idempotency-Key: inserted, or an expired record replaced; a key still held
--      answers 'existing' (its stored hash, status and body) and the row writes nothing else;
--   2. the key's spend limit and its member's monthly budget (gw_spend_reserve) ->
--      refused: 'key_spend_limit' / 'member_budget';
--   3. the charge through the ledger's one writer, gw_post (soft: an uncovered debit leaves
--      nothing and answers NULL) -> 'insufficient', the reservation of 2. given back;
--   4. the 'pending' call row, with who acted (actor) apart from who pays (account_id) and
--      what its spend reservation was counted in (the key's period, the member whose month;
--      the sweep refunds the call after its deadline if nobody finalizes it) -> 'opened'.
-- A refused row leaves nothing behind (its key record is deleted). Any other error fails
-- the whole statement (nothing committed); the caller then opens each row alone.
-- Each lock wait lasts at most p_lock_wait_ms (lock_timeout, below deadlock_timeout; 0: no
-- limit): a group may hold several accounts' rows, so a long wait could be a deadlock.
-- The commit does not wait for the WAL flush: the finalize's durable commit flushes it
-- before any answer that depends on it (docs/performance.md, "What a crash can lose").
CREATE OR REPLACE FUNCTION gw_open_calls(p_rows jsonb, p_lock_wait_ms integer)
RETURNS TABLE(call_id varchar, outcome text, idem_hash varchar, idem_status varchar, idem_body text)
LANGUAGE plpgsql AS $fn$
DECLARE
    b record;
    v_n integer;
    v_spend text;
    v_from timestamptz;
    v_member varchar;
    v_refused text;
BEGIN
    PERFORM gw_group_settings(p_lock_wait_ms, true);

    FOR b IN SELECT * FROM jsonb_to_recordset(p_rows)
                AS x(call_id varchar, account_id varchar, actor varchar, module_id integer,
                     slug varchar, action varchar, mode varchar, price bigint, charged boolean,
                     owner_agent_id varchar, idem_key varchar, req_hash varchar,
                     now timestamptz, deadline timestamptz, idem_expires timestamptz,
                     codes varchar[], amounts bigint[], spend_key varchar)
              ORDER BY x.account_id COLLATE "C", x.idem_key COLLATE "C" NULLS FIRST LOOP
        v_spend := 'none';
        v_from := NULL;
        v_member := NULL;
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
            -- 2. the key's spend limit and the member's budget, before any debit
            SELECT s.outcome, s.reserved_from, s.budget_member INTO v_spend, v_from, v_member
              FROM gw_spend_reserve(b.spend_key, b.price, b.now) AS s;
            IF v_spend = 'refused' THEN
                v_refused := 'key_spend_limit';
            ELSIF v_spend = 'budget_refused' THEN
                v_refused := 'member_budget';
            -- 3. the charge (soft: refused -> nothing posted, the reservation back)
            ELSIF gw_post('module_call', 'call:' || b.call_id, b.account_id, b.actor, NULL,
                          b.codes, b.amounts, b.now, true) IS NULL THEN
                v_refused := 'insufficient';
                PERFORM gw_spend_release(b.spend_key, b.price, v_from, b.account_id, v_member, b.now);
            END IF;
            IF v_refused IS NOT NULL THEN
                IF b.idem_key IS NOT NULL THEN
                    DELETE FROM idempotency_records r
                     WHERE r.account_id = b.account_id AND r.key = b.idem_key AND r.call_id = b.call_id;
                END IF;
                RETURN QUERY SELECT b.call_id, v_refused, NULL::varchar, NULL::varchar, NULL::text;
                CONTINUE;
            END IF;
        END IF;

        -- 4. the pending call
        INSERT INTO module_calls (id, account_id, actor, module_id, module_slug, action, mode, status,
                                  price_micros, charged, owner_agent_id, idempotency_key,
                                  spend_key_id, spend_reserved_from, budget_member_id, created_at, deadline_at)
        VALUES (b.call_id, b.account_id, b.actor, b.module_id, b.slug, b.action, b.mode, 'pending',
                b.price, b.charged, b.owner_agent_id, b.idem_key,
                CASE WHEN v_from IS NOT NULL THEN b.spend_key END, v_from, v_member, b.now, b.deadline);

        RETURN QUERY SELECT b.call_id, 'opened'::text, NULL::varchar, NULL::varchar, NULL::text;
    END LOOP;
END
$fn$;
