-- gw_chat_settles(rows, lock_wait_ms): chat completions' settles for a group in ONE
-- autocommit statement, committed durably (the session default) before any of their
-- answers leaves. Called by app/services/money/holds_pg.py (GroupSettler: the settles of
-- one process that arrive while one is being written share the next statement and its
-- WAL flush; a settle alone is a group of one).
--
-- Each row is settled by gw_chat_settle (the rule, written once there), in payer order
-- ((account_id, id), COLLATE "C", as the holds and opens), and answered: (the completion,
-- charged, the hold's spend-limited key, the hold's time, micros given back). A completion
-- no longer held (settled or released before) has no answer row and nothing written.
-- Any error fails the whole statement (nothing committed); the caller then settles each
-- row alone. Each lock wait lasts at most p_lock_wait_ms (lock_timeout; 0: no limit).
CREATE OR REPLACE FUNCTION gw_chat_settles(p_rows jsonb, p_lock_wait_ms integer)
RETURNS TABLE (completion_id varchar, charged bigint, spend_key_id varchar, held_at timestamptz,
               give_back bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    b record;
BEGIN
    PERFORM gw_group_settings(p_lock_wait_ms, false);
    FOR b IN SELECT * FROM jsonb_to_recordset(p_rows)
                AS x(id varchar, created_at timestamptz, account_id varchar, customer varchar,
                     hold_code varchar, revenue varchar, hold bigint, cost bigint, model varchar,
                     provider varchar, prompt_tokens integer, completion_tokens integer,
                     estimated boolean, attempts integer, latency_ms integer, error varchar,
                     now timestamptz)
              ORDER BY x.account_id COLLATE "C", x.id COLLATE "C" LOOP
        RETURN QUERY
            SELECT b.id, s.charged, s.spend_key_id, s.held_at, s.give_back
              FROM gw_chat_settle(b.id, b.created_at, b.account_id, b.customer, b.hold_code,
                                  b.revenue, b.hold, b.cost, b.model, b.provider,
                                  b.prompt_tokens, b.completion_tokens, b.estimated,
                                  b.attempts, b.latency_ms, b.error, b.now) AS s;
    END LOOP;
END
$fn$;
