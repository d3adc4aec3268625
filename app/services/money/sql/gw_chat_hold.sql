-- gw_chat_hold: a chat completion's hold in ONE autocommit statement. Called by
-- app/services/money/holds_pg.py (money.holds.hold).
--   1. the key's spend limit (gw_spend_reserve) -> refused: RAISE GWKSL;
--   2. the 'held' completion row (who acted apart from who pays; the reservation's period);
--   3. the hold posting through gw_post (customer -H, hold:chat +H) -> uncovered: RAISE GW402.
-- A refusal RAISEs, so the server undoes the whole statement (the key's counter included).
-- The commit does not wait for the WAL flush: settle/release commit durably before any
-- answer, and PostgreSQL flushes the WAL in order.
CREATE OR REPLACE FUNCTION gw_chat_hold(
    p_id varchar, p_account_id varchar, p_actor varchar, p_requested_model varchar,
    p_stream boolean, p_hold bigint, p_spend_key_id varchar, p_now timestamptz,
    p_codes varchar[], p_amounts bigint[])
RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    v_spend text;
    v_from timestamptz;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);

    SELECT s.outcome, s.reserved_from INTO v_spend, v_from
      FROM gw_spend_reserve(p_spend_key_id, p_hold, p_now) AS s;
    IF v_spend = 'refused' THEN
        RAISE EXCEPTION 'key spend limit' USING ERRCODE = 'GWKSL';
    END IF;

    INSERT INTO chat_completions (id, account_id, actor, mode, requested_model, status, stream,
                                  hold_micros, spend_key_id, spend_reserved_from, cost_micros,
                                  prompt_tokens, completion_tokens, usage_estimated, attempts,
                                  latency_ms, created_at)
    VALUES (p_id, p_account_id, p_actor, 'live', p_requested_model, 'held', p_stream, p_hold,
            CASE WHEN v_spend = 'reserved' THEN p_spend_key_id END, v_from,
            0, 0, 0, false, 0, 0, p_now);

    IF p_hold > 0 THEN
        PERFORM gw_post('chat_hold', 'chat_hold:' || p_id, p_account_id, p_actor, NULL,
                        p_codes, p_amounts, p_now);
    END IF;
    RETURN 'held';
END
$fn$;
