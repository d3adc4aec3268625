-- gw_chat_hold: a chat completion's hold in ONE autocommit statement. Called by
-- app/services/money/holds_pg.py (money.holds.hold).
--   1. the key's spend limit and its member's monthly budget (gw_spend_reserve) -> refused:
--      RAISE GWKSL (the key's limit) / GWMBR (the member's budget);
--   2. the 'held' completion row (who acted apart from who pays; what the reservation was
--      counted in: the key's period, the member whose month);
--   3. the hold posting through gw_post (customer -H, hold:chat +H) -> uncovered: RAISE GW402.
-- A refusal RAISEs, so the server undoes the whole statement (the counters included).
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
    v_member varchar;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);

    SELECT s.outcome, s.reserved_from, s.budget_member INTO v_spend, v_from, v_member
      FROM gw_spend_reserve(p_spend_key_id, p_hold, p_now) AS s;
    IF v_spend = 'refused' THEN
        RAISE EXCEPTION 'key spend limit' USING ERRCODE = 'GWKSL';
    ELSIF v_spend = 'budget_refused' THEN
        RAISE EXCEPTION 'member budget' USING ERRCODE = 'GWMBR';
    END IF;

    INSERT INTO chat_completions (id, account_id, actor, mode, requested_model, status, stream,
                                  hold_micros, spend_key_id, spend_reserved_from, budget_member_id, cost_micros,
                                  prompt_tokens, completion_tokens, usage_estimated, attempts,
                                  latency_ms, created_at)
    VALUES (p_id, p_account_id, p_actor, 'live', p_requested_model, 'held', p_stream, p_hold,
            CASE WHEN v_from IS NOT NULL THEN p_spend_key_id END, v_from, v_member,
            0, 0, 0, false, 0, 0, p_now);

    IF p_hold > 0 THEN
        PERFORM gw_post('chat_hold', 'chat_hold:' || p_id, p_account_id, p_actor, NULL,
                        p_codes, p_amounts, p_now);
    END IF;
    RETURN 'held';
END
$fn$;
