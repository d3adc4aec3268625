-- gw_chat_holds(rows, lock_wait_ms): chat completions' holds for a group in ONE autocommit
-- statement. Called by app/services/money/holds_pg.py (GroupHolder: the holds of one
-- process that arrive while one is being written share the next statement; a hold alone
-- is a group of one).
--
-- Per row, in payer order ((account_id, id), COLLATE "C", as gw_open_calls, so two groups
-- take account rows in the same order), each row answered its own outcome:
--   1. the key's spend limit and its member's monthly budget (gw_spend_reserve) ->
--      refused: 'key_spend_limit' / 'member_budget';
--   2. the hold posting through the ledger's one writer, gw_post (customer -H, hold:chat
--      +H; soft: an uncovered debit leaves nothing and answers NULL) -> 'insufficient',
--      the reservation of 1. given back;
--   3. the 'held' completion row (who acted apart from who pays; what the reservation was
--      counted in: the key's period, the member whose month) -> 'held'.
-- A refused row leaves nothing behind. Any other error fails the whole statement (nothing
-- committed); the caller then holds each row alone.
-- Each lock wait lasts at most p_lock_wait_ms (lock_timeout; 0: no limit): a group may
-- hold several accounts' rows, so a long wait could be a deadlock.
-- The commit does not wait for the WAL flush: the settle or release commits durably
-- before any answer, and PostgreSQL flushes the WAL in order.
CREATE OR REPLACE FUNCTION gw_chat_holds(p_rows jsonb, p_lock_wait_ms integer)
RETURNS TABLE(completion_id varchar, outcome text)
LANGUAGE plpgsql AS $fn$
DECLARE
    b record;
    v_reserved record;  -- gw_spend_reserve's answer: outcome, reserved_from, budget_member
    v_refused text;
BEGIN
    PERFORM gw_group_settings(p_lock_wait_ms, true);

    FOR b IN SELECT * FROM jsonb_to_recordset(p_rows)
                AS x(id varchar, account_id varchar, actor varchar, requested_model varchar,
                     stream boolean, hold bigint, spend_key varchar, now timestamptz,
                     codes varchar[], amounts bigint[])
              ORDER BY x.account_id COLLATE "C", x.id COLLATE "C" LOOP
        -- 1. the key's spend limit and the member's budget, before any debit
        SELECT * INTO v_reserved FROM gw_spend_reserve(b.spend_key, b.hold, b.now);
        v_refused := CASE v_reserved.outcome WHEN 'refused' THEN 'key_spend_limit'
                                             WHEN 'budget_refused' THEN 'member_budget' END;
        -- 2. the hold (soft: refused -> nothing posted, the reservation back)
        IF v_refused IS NULL AND b.hold > 0
           AND gw_post('chat_hold', 'chat_hold:' || b.id, b.account_id, b.actor, NULL,
                       b.codes, b.amounts, b.now, true) IS NULL THEN
            v_refused := 'insufficient';
            PERFORM gw_spend_release(b.spend_key, b.hold, v_reserved.reserved_from, b.account_id,
                                     v_reserved.budget_member, b.now);
        END IF;
        IF v_refused IS NOT NULL THEN
            RETURN QUERY SELECT b.id, v_refused;
            CONTINUE;
        END IF;

        -- 3. the held completion
        INSERT INTO chat_completions (id, account_id, actor, mode, requested_model, status, stream,
                                      hold_micros, spend_key_id, spend_reserved_from, budget_member_id,
                                      cost_micros, prompt_tokens, completion_tokens, usage_estimated,
                                      attempts, latency_ms, created_at)
        VALUES (b.id, b.account_id, b.actor, 'live', b.requested_model, 'held', b.stream, b.hold,
                CASE WHEN v_reserved.reserved_from IS NOT NULL THEN b.spend_key END,
                v_reserved.reserved_from, v_reserved.budget_member,
                0, 0, 0, false, 0, 0, b.now);
        RETURN QUERY SELECT b.id, 'held'::text;
    END LOOP;
END
$fn$;
